"""``prexy convert nginx``: nginx configurations in, Prexy configurations out
that load (as ``twistd prexy --check`` loads them), with every directive
converted or reported.  Debian's default nginx.conf, the benchmark's nginx +
subs_filter configuration (its converted rules rewrite the realistic page as
subs_filter does), 1,000 generated server blocks, and a broken file."""

from __future__ import annotations

import io
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from prexy.config import load_config
from prexy.nginxconf.cli import main
from prexy.nginxconf.convert import Conversion, convert, parse_size, parse_time
from prexy.nginxconf.parser import load, parse
from prexy.substitution.rules import parse_rules
from prexy.substitution.transducer import Transducer
from tests import pki

DATA = Path(__file__).resolve().parent / "data"  # Debian's /etc/nginx, includes made relative
BENCH = Path(__file__).resolve().parent.parent.parent / "bench"


def _write(conversion: Conversion, out: str) -> str:
    for path, data in conversion.files.items():
        target = os.path.join(out, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as f:
            f.write(data)
    return os.path.join(out, "prexy.toml")


def _convert_text(case: SynchronousTestCase, text: str, prefix: str | None = None) -> tuple[Conversion, str]:
    """Convert ``text`` (an nginx.conf in a scratch folder); write the result
    and load it as --check does; the conversion and the scratch folder."""
    scratch = os.path.abspath(case.mktemp())
    os.makedirs(scratch)
    conf = os.path.join(scratch, "nginx.conf")
    with open(conf, "w") as f:
        f.write(text)
    result = convert(load(conf), prefix or scratch)
    load_config(_write(result, os.path.join(scratch, "out")), now=time.time())
    return result, scratch


def _rules(result: Conversion, site: str) -> str:
    return result.files[f"rules/{site}.rules"].decode()


def _toml(result: Conversion) -> str:
    return result.files["prexy.toml"].decode()


def _reported(result: Conversion, kind: str = "skipped") -> str:
    return "\n".join(str(n) for n in result.of_kind(kind))


class DebianDefaultTests(SynchronousTestCase):
    """Debian's /etc/nginx/nginx.conf and its default site (a static file
    server, includes made relative)."""

    def test_converts_and_loads(self) -> None:
        directives = load(str(DATA / "debian" / "nginx.conf"))
        result = convert(directives, str(DATA / "debian"))
        config = load_config(_write(result, self.mktemp()), now=time.time())
        self.assertEqual([s.name for s in config.sites], ["default"])
        toml = _toml(result)
        self.assertIn('listen = ["tcp6:80:interface=\\\\:\\\\:"]', toml)
        self.assertIn("enabled = true", toml)  # gzip on
        report = result.files["REPORT.txt"].decode()
        # no server proxies: said at the top of the list, with the placeholder
        self.assertIn("placeholder", report)
        self.assertRegex(report, r"sites-enabled/default:\d+: server \{ \.\.\. \}: server not converted")
        self.assertRegex(report, r"nginx\.conf:\d+: ssl_protocols ")
        self.assertIn("dual-stack", report)

    def test_every_directive_accounted(self) -> None:
        """Each directive of the file is converted or in the report: the
        report's lines name real places of the file."""
        directives = load(str(DATA / "debian" / "nginx.conf"))
        result = convert(directives, str(DATA / "debian"))
        for note in result.notes:
            if note.file != "-":
                self.assertTrue(os.path.exists(note.file), note)
        for name in ("user", "pid", "error_log", "events", "sendfile", "tcp_nopush", "types_hash_max_size",
                     "default_type", "ssl_prefer_server_ciphers"):
            self.assertRegex(_reported(result), rf": {name}\b", name)


class BenchmarkConfigTests(SynchronousTestCase):
    """The benchmark's nginx + subs_filter configuration (bench/servers.py
    and bench/realistic.py): converted, its rules rewrite the realistic page
    as subs_filter does, and as the benchmark's own Prexy rules do."""

    def setUp(self) -> None:
        if str(BENCH) not in sys.path:
            sys.path.append(str(BENCH))
        import realistic

        try:
            self.page = realistic.load_page("html-20k")
        except OSError:
            self.skipTest("the realistic pages' Debian packages are not installed")
        self.realistic = realistic

    def _bench_conf(self, count: int) -> str:
        import servers

        body = "".join("            " + line + "\n"
                       for line in self.realistic.subs_filter_directives(count).splitlines())
        scratch = os.path.abspath(self.mktemp())
        return servers.nginx_conf(Path(scratch), 18080, servers.proxy_location(body),
                                  http_extra=servers.upstream_block(18081))

    def test_same_output_as_subs_filter(self) -> None:
        result, _ = _convert_text(self, self._bench_conf(10))
        self.assertEqual(result.sites, ("default",))
        self.assertIn('upstream = "http://127.0.0.1:18081"', _toml(result))
        self.assertIn('listen = ["tcp:18080:interface=127.0.0.1:backlog=4096"]', _toml(result))
        rules = _rules(result, "default")
        converted = Transducer(parse_rules(rules, "converted.rules"), timeout=None).finish(self.page)
        model = _subs_filter_model(self.realistic.subs_filter_directives(10), self.page)
        own = Transducer(parse_rules(self.realistic.rules_text(10), "bench.rules"), timeout=None).finish(self.page)
        self.assertNotEqual(converted, self.page)
        self.assertEqual(converted, model)
        self.assertEqual(converted, own)
        self.assertIn("proxy_set_header Connection", _reported(result, "unneeded"))
        self.assertIn("proxy_http_version 1.1", _reported(result, "unneeded"))


def _subs_filter_model(directives: str, page: bytes) -> bytes:
    """subs_filter as its module applies it: line by line, each rule in turn
    on what the rules before it made; ``o`` replaces the first match of the
    response only; ``$N`` is one digit."""
    rules: list[list[Any]] = []
    for d in parse(directives, "subs"):
        if d.name != "subs_filter":
            continue
        pattern, repl, flags = d.args
        regex = re.compile(pattern if "r" in flags else re.escape(pattern), re.I if "i" in flags else 0)
        template = re.sub(r"\$(\d)", r"\\g<\1>", repl) if "r" in flags else repl.replace("\\", "\\\\")
        rules.append([regex, template, "o" in flags, False])
    out = []
    for line in page.decode("latin-1").splitlines(keepends=True):
        for rule in rules:
            regex, template, once, done = rule
            if once and done:
                continue
            line, n = regex.subn(template, line, count=1 if once else 0)
            rule[3] = done or n > 0
        out.append(line)
    return "".join(out).encode("latin-1")


class DirectiveTests(SynchronousTestCase):
    """The directives the converter takes, each as nginx means it."""

    def _one(self, server: str, http: str = "") -> tuple[Conversion, str]:
        return _convert_text(self, f"events {{}}\nhttp {{\n{http}\nserver {{\n{server}\n}}\n}}\n")

    def test_listen_server_name_upstream_host(self) -> None:
        result, _ = self._one(
            "listen 8080; listen [::1]:8081 default_server; server_name .shop.example www.other.example;\n"
            "location / { proxy_pass https://origin.example:8443; proxy_set_header Host $http_host; }",
            "upstream unused { server 10.0.0.1; }")
        toml = _toml(result)
        self.assertIn('listen = ["tcp:8080", "tcp:8081:interface=\\\\:\\\\:1"]', toml)
        self.assertIn('hosts = ["shop.example", "*.shop.example", "www.other.example"]', toml)
        self.assertIn('upstream = "https://origin.example:8443"', toml)
        self.assertIn('host_header = "pass"', toml)
        self.assertIn("upstream unused { ... }: no site proxies to this upstream", _reported(result))

    def test_log_format(self) -> None:
        """An access log in a log_format whose variables Prexy writes takes
        it as access_log_format; one with a variable Prexy does not write is
        reported with that variable."""
        server = "listen 8080; location / { proxy_pass http://127.0.0.1:9; }"
        result, scratch = self._one(server, (
            "log_format timed '$remote_addr [$time_local] \"$request\" $status '\n"
            "                 '$body_bytes_sent rt=$request_time cs=$upstream_cache_status';\n"
            "access_log logs/access.log timed;"
        ))
        config = load_config(os.path.join(scratch, "out", "prexy.toml"), now=time.time())
        self.assertEqual(
            config.access_log_format,
            '$remote_addr [$time_local] "$request" $status $body_bytes_sent rt=$request_time cs=$upstream_cache_status',
        )
        result, _ = self._one(server, "log_format up '$upstream_response_time';\naccess_log logs/a.log up;")
        self.assertIn("unknown variable $upstream_response_time", _reported(result))
        self.assertNotIn("access_log_format", _toml(result))

    def test_default_host_header_is_the_upstreams(self) -> None:
        result, _ = self._one("listen 8080; location / { proxy_pass http://127.0.0.1:9; }")
        self.assertIn('host_header = "upstream"', _toml(result))

    def test_upstream_block_first_server(self) -> None:
        result, _ = self._one("listen 8080; location / { proxy_pass http://pool; }",
                              "upstream pool { server 10.0.0.1:81; server 10.0.0.2:81; keepalive 8; }")
        self.assertIn('upstream = "http://10.0.0.1:81"', _toml(result))
        self.assertIn("server 10.0.0.2:81: Prexy has one upstream per site", _reported(result))

    def test_ssl_certificates(self) -> None:
        scratch = os.path.abspath(self.mktemp())
        os.makedirs(scratch)
        cert, key = pki.self_signed("shop.example", dns=("shop.example",))
        with open(os.path.join(scratch, "shop.crt"), "wb") as f:
            f.write(cert.public_bytes(pki.serialization.Encoding.PEM))
        with open(os.path.join(scratch, "shop.key"), "wb") as f:
            f.write(pki.key_pem(key))
        text = ("http { server { listen 443 ssl http2; listen 80; server_name shop.example;"
                " ssl_certificate shop.crt; ssl_certificate_key shop.key;"
                " location / { proxy_pass http://127.0.0.1:9; } } }")
        result, _ = _convert_text(self, text, prefix=scratch)
        toml = _toml(result)
        self.assertIn('listen = ["ssl:443", "tcp:80"]', toml)
        self.assertIn(f'tls_certificate = "{scratch}/shop.crt"', toml)
        self.assertIn(f'tls_key = "{scratch}/shop.key"', toml)
        self.assertEqual(toml.count("tls_certificate"), 2)  # [server] and the site

    def test_rules_header_directives_and_inheritance(self) -> None:
        result, _ = self._one(
            "listen 8080; add_header X-Server yes;\n"
            "location / { proxy_pass http://127.0.0.1:9; add_header X-Loc 1 always;\n"
            "  replace_filter 'a\\.b' 'c' gi; replace_filter_types text/html text/css;\n"
            "  proxy_redirect http://127.0.0.1:9/ /; proxy_cookie_domain origin.example $host;\n"
            "  proxy_cookie_path /a/ /; proxy_set_header X-Real-IP $remote_addr; proxy_hide_header X-Powered-By; }",
            "proxy_set_header X-Http 1;")
        rules = _rules(result, "default")
        self.assertIn("replace_filter 'a\\\\.b' c gi;", rules)
        self.assertIn("add_header X-Loc 1 always;", rules)
        self.assertNotIn("X-Server", rules)  # location / has add_header of its own: nginx ignores the server's
        self.assertNotIn("X-Http", rules)
        for line in ("replace_filter_types text/html text/css;", "proxy_redirect http://127.0.0.1:9/ /;",
                     "proxy_cookie_domain origin.example $host;", "proxy_cookie_path /a/ /;",
                     "proxy_set_header X-Real-IP $remote_addr;", "proxy_hide_header X-Powered-By;"):
            self.assertIn(line, rules)
        self.assertIn("add_header X-Server yes: no Prexy equivalent", _reported(result))

    def test_refused_rule_is_reported_with_prexys_reason(self) -> None:
        result, _ = self._one("listen 8080; location / { proxy_pass http://127.0.0.1:9;"
                              " proxy_set_header X-Id $request_id; replace_filter a b g; }")
        self.assertNotIn("X-Id", _rules(result, "default"))
        self.assertRegex(_reported(result), r"proxy_set_header X-Id \$request_id: Prexy refuses it: .*request_id")

    def test_subs_filter(self) -> None:
        result, _ = self._one(
            "listen 8080; location / { proxy_pass http://127.0.0.1:9;\n"
            "  subs_filter a.b x;\n"               # fixed, all (g is the default)
            "  subs_filter '(\\d)(\\d)' '$2$19' r;\n"  # $19 is $1 then 9
            "  subs_filter Foo bar io;\n"
            "  subs_filter '[^<]+end' y gr;\n"
            "  subs_filter x $host;\n"
            "  subs_filter_types text/css; }")
        rules = _rules(result, "default")
        self.assertIn("replace_filter 'a\\\\.b' x g;", rules)
        self.assertIn("replace_filter '(\\\\d)(\\\\d)' '${2}${1}9' g;", rules)
        self.assertIn("replace_filter Foo bar i;", rules)
        self.assertIn("replace_filter_types text/css;", rules)
        self.assertIn("subs_filter x $host: not converted: the replacement has a variable", _reported(result))
        self.assertIn("subs_filter matches within one line", _reported(result, "differs"))
        ruleset = parse_rules(rules, "r")
        self.assertEqual(Transducer(ruleset, timeout=None).finish(b"a.b 12 FOO foo"), b"x 219 bar foo")

    def test_sub_filter(self) -> None:
        result, _ = self._one("listen 8080; location / { proxy_pass http://127.0.0.1:9;"
                              " sub_filter 'Old (c)' new; sub_filter_once off; sub_filter_last_modified on; }")
        rules = _rules(result, "default")
        self.assertIn("replace_filter 'Old \\\\(c\\\\)' new gi;", rules)
        self.assertIn("replace_filter_last_modified keep;", rules)
        ruleset = parse_rules(rules, "r")
        self.assertEqual(Transducer(ruleset, timeout=None).finish(b"old (C) OLD (c)"), b"new new")

    def test_map_and_its_if(self) -> None:
        result, scratch = self._one(
            "listen 8080; if ($moved) { return 308 $moved; }\n"
            "location / { proxy_pass http://127.0.0.1:9; }",
            "map $request_uri $moved { default ''; /old /new; '~^/item\\.php\\?id=(\\d+)' /items/$1; }\n"
            "map $uri $unused { default 0; }")
        toml = _toml(result)
        for line in ('map = "maps/moved.map"', 'map_action = "redirect"', "redirect_status = 308",
                     "map_keep_query = false"):
            self.assertIn(line, toml)
        from prexy.urlmap.loader import load_map

        urlmap = load_map(os.path.join(scratch, "out", "maps", "moved.map"))
        self.assertEqual(urlmap.lookup("/item.php?id=42"), "/items/42")
        self.assertEqual(urlmap.lookup("/old"), "/new")
        self.assertEqual(urlmap.lookup("/other"), "")
        self.assertIn("map $uri $unused { ... }", _reported(result))

    def test_map_rewrite(self) -> None:
        result, _ = self._one(
            "listen 8080; location / { proxy_pass http://127.0.0.1:9; if ($new) { rewrite ^ $new last; } }",
            "map $request_uri $new { /a /b; }")
        self.assertIn('map_action = "rewrite"', _toml(result))

    def test_gzip_cache_body_size_timeouts(self) -> None:
        result, _ = self._one(
            "listen 8080; location / { proxy_pass http://127.0.0.1:9; proxy_cache one;"
            " proxy_cache_valid 200 302 10m; proxy_cache_valid 404 1m; }",
            "gzip on; gzip_types text/css application/json; gzip_comp_level 5; gzip_min_length 1k;\n"
            "client_max_body_size 10m; proxy_connect_timeout 3s; proxy_read_timeout 1m30s;\n"
            "client_header_timeout 20; client_body_timeout 500ms; proxy_send_timeout 9;\n"
            "proxy_cache_path /var/cache/x keys_zone=one:10m max_size=2g;")
        toml = _toml(result)
        for line in ('types = ["text/html", "text/css", "application/json"]', "gzip_level = 5",
                     "min_length = 1024", 'max_request_body = "10M"', "connect = 3", "first_byte = 90",
                     "idle = 90", "client_header = 20", "client_body = 0.5", 'size = "2G"',
                     "cache = true", "cache_ttl = 600"):
            self.assertIn(line, toml)
        self.assertIn("proxy_cache_valid 404 1m: Prexy has one cache_ttl", _reported(result, "differs"))
        self.assertIn("proxy_send_timeout 9: no Prexy key", _reported(result))

    def test_no_cache_in_nginx_no_cache_in_prexy(self) -> None:
        result, _ = self._one("listen 8080; location / { proxy_pass http://127.0.0.1:9; }")
        self.assertIn("cache = false", _toml(result))
        self.assertIn("enabled = false", _toml(result))  # nginx's gzip is off by default

    def test_other_locations_and_servers_reported(self) -> None:
        result, _ = _convert_text(
            self, "http { server { listen 80; server_name a.example; return 301 https://$host$request_uri; }\n"
                  "server { listen 8080; server_name a.example; location / { proxy_pass http://127.0.0.1:9; }\n"
                  " location /api/ { proxy_pass http://127.0.0.1:10; } } }")
        report = _reported(result)
        self.assertRegex(report, r"nginx.conf:1: server \{ \.\.\. \}: server not converted: no location /")
        self.assertRegex(report, r"nginx.conf:3: location /api/ \{ \.\.\. \}: Prexy applies one set of rules")

    def test_per_site_settings(self) -> None:
        """A server's own gzip becomes its compression table; a server's own
        timeout (Prexy's are for the whole server) is reported; an ssl
        listener with no certificate anywhere is left out, said why."""
        result, _ = self._one("listen 8443 ssl; listen 8080; gzip off; proxy_read_timeout 5;"
                              " location / { proxy_pass http://127.0.0.1:9; subs_filter a b; subs_filter c d; }",
                              "gzip on;")
        toml = _toml(result)
        self.assertIn('listen = ["tcp:8080"]', toml)
        self.assertIn("compression = { enabled = false }", toml)
        self.assertIn("proxy_read_timeout 5: Prexy has this for the whole server", _reported(result))
        self.assertIn("ssl:8443 left out: no ssl_certificate", _reported(result))
        self.assertIn("subs_filter applies its 2 rules one after another", _reported(result, "differs"))

    def test_empty_file_and_a_file_of_servers(self) -> None:
        """An empty file still gives a configuration that loads (a placeholder
        site, reported); a sites-enabled file of bare server blocks converts."""
        result, _ = _convert_text(self, "")
        self.assertIn("placeholder", _reported(result))
        result, _ = _convert_text(self, "server { listen 8081; server_name x.test;"
                                        " location / { proxy_pass http://127.0.0.1:9; } }\n")
        self.assertEqual(result.sites, ("x_test",))
        self.assertEqual(result.notes, ())

    def test_units(self) -> None:
        self.assertEqual(parse_time("1m30s"), 90)
        self.assertEqual(parse_time("500ms"), 0.5)
        self.assertIsNone(parse_time("5x"))
        self.assertEqual(parse_size("8k"), 8192)
        self.assertEqual(parse_size("1M"), 1024**2)
        self.assertIsNone(parse_size("1t"))


class ReplaceFilterConformanceTests(SynchronousTestCase):
    """replace-filter's conformance cases, each one server's rules: every
    rule comes through unchanged (the same pattern, replacement and flags
    as Prexy reads them), or is reported with Prexy's reason; the whole
    result loads."""

    def test_conformance_rules(self) -> None:
        from prexy.nginxconf.parser import Directive, dump
        from prexy.substitution.rules import tokenize
        from tests.substitution.shared import SKIP_REASON, load_cases

        cases = load_cases("replace_filter_cases.json")
        if cases is None:
            raise self.skipTest(SKIP_REASON)
        servers = []
        wanted: dict[str, list[tuple[str, ...]]] = {}
        for i, case in enumerate(cases):
            rules = [(r["pattern"], r["replacement"], *([r["flags"]] if r["flags"] else [])) for r in case["rules"]]
            wanted[f"c{i}_test"] = rules
            location = Directive("location", ("/",), (
                Directive("proxy_pass", ("http://127.0.0.1:9",), None, "f", 0),
                *(Directive("replace_filter", rule, None, "f", 0) for rule in rules)), "f", 0)
            servers.append(Directive("server", (), (
                Directive("listen", ("8080",), None, "f", 0),
                Directive("server_name", (f"c{i}.test",), None, "f", 0), location), "f", 0))
        result, _ = _convert_text(self, dump((Directive("http", (), tuple(servers), "f", 0),)))
        self.assertEqual(len(result.sites), len(cases))
        refused = [n for n in result.of_kind("skipped") if n.reason.startswith("Prexy refuses it: ")]
        carried = 0
        for site, rules in wanted.items():
            text = result.files.get(f"rules/{site}.rules", b"")
            got = [tuple(t.value.decode() for t in tokens[1:]) for tokens in tokenize(text, "r")
                   if tokens[0].value == b"replace_filter"]
            for rule in rules:
                carried += rule in got
        total = sum(len(rules) for rules in wanted.values())
        self.assertEqual(carried + len(refused), total)
        self.assertGreater(carried, 50)


class ThousandServersTests(SynchronousTestCase):
    """1,000 server blocks with certificates, rules and a map: the result
    loads, in reasonable time."""

    def test_thousand(self) -> None:
        scratch = os.path.abspath(self.mktemp())
        os.makedirs(scratch)
        cert, key = pki.self_signed("example.test", dns=("*.example.test",))
        with open(os.path.join(scratch, "wild.crt"), "wb") as f:
            f.write(cert.public_bytes(pki.serialization.Encoding.PEM))
        with open(os.path.join(scratch, "wild.key"), "wb") as f:
            f.write(pki.key_pem(key))
        servers = []
        for i in range(1000):
            servers.append(
                f"server {{ listen 443 ssl; listen 80; server_name site{i}.example.test;\n"
                f"  ssl_certificate wild.crt; ssl_certificate_key wild.key;\n"
                f"  if ($moved) {{ return 301 $moved; }}\n"
                f"  location / {{ proxy_pass http://127.0.0.1:{10000 + i % 50};\n"
                f"    subs_filter origin{i % 10}.example clone.example gi;\n"
                f"    replace_filter 'UA-\\d+' UA-0 g; proxy_set_header Host $host; }} }}\n")
        text = ("events {}\nhttp {\nmap $request_uri $moved { default ''; /old /new; ~^/p/(\\d+)$ /q/$1; }\n"
                + "".join(servers) + "}\n")
        with open(os.path.join(scratch, "nginx.conf"), "w") as f:
            f.write(text)
        started = time.monotonic()
        result = convert(load(os.path.join(scratch, "nginx.conf")), scratch)
        converted = time.monotonic() - started
        config = load_config(_write(result, os.path.join(scratch, "out")), now=time.time())
        self.assertEqual(len(config.sites), 1000)
        self.assertEqual(len([p for p in result.files if p.startswith("rules/")]), 1000)
        self.assertEqual([p for p in result.files if p.startswith("maps/")], ["maps/moved.map"])
        self.assertEqual([n.directive for n in result.of_kind("skipped")], ["events { ... }"])
        self.assertLess(converted, 30)
        self._scratch = scratch


class BrokenFileTests(SynchronousTestCase):
    """A file nginx refuses: file, line and reason as nginx says them, and nothing written."""

    def test_broken(self) -> None:
        scratch = os.path.abspath(self.mktemp())
        os.makedirs(scratch)
        conf = os.path.join(scratch, "nginx.conf")
        with open(conf, "w") as f:
            f.write("http {\n    server {\n        listen 80\n    }\n}\n")
        out, err = io.StringIO(), io.StringIO()
        code = main(["nginx", conf, "-o", os.path.join(scratch, "out")], out, err)
        self.assertEqual(code, 1)
        self.assertEqual(err.getvalue(), f'prexy convert: [emerg] unexpected "}}" in {conf}:4\n')
        self.assertFalse(os.path.exists(os.path.join(scratch, "out")))

    def test_missing_include(self) -> None:
        scratch = os.path.abspath(self.mktemp())
        os.makedirs(scratch)
        conf = os.path.join(scratch, "nginx.conf")
        with open(conf, "w") as f:
            f.write("http {\n    include missing.conf;\n}\n")
        err = io.StringIO()
        self.assertEqual(main(["nginx", conf, "-o", os.path.join(scratch, "out")], io.StringIO(), err), 1)
        self.assertIn('open() "' + os.path.join(scratch, "missing.conf") + '" failed', err.getvalue())
        self.assertIn(f"in {conf}:2", err.getvalue())

    def test_cli_writes_the_files(self) -> None:
        scratch = os.path.abspath(self.mktemp())
        out = io.StringIO()
        code = main(["nginx", str(DATA / "debian" / "nginx.conf"), "-o", scratch], out, io.StringIO())
        self.assertEqual(code, 0)
        self.assertIn("1 site(s)", out.getvalue())
        for name in ("prexy.toml", "REPORT.txt"):
            self.assertTrue(os.path.exists(os.path.join(scratch, name)))
