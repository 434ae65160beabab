"""Reading nginx configuration files, the base of ``prexy convert nginx``.

:mod:`prexy.nginxconf.parser` turns nginx's configuration text into a tree of
:class:`~prexy.nginxconf.parser.Directive` values, following nginx's own
lexer (``src/core/ngx_conf_file.c``) token for token, with its error messages,
files and lines; :func:`~prexy.nginxconf.parser.load` follows ``include`` the
way nginx does.  Pure: imports no Twisted.
"""
