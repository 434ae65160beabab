"""Config parsing: valid files become frozen values, every error names the
file, the line, the key and the reason."""

from __future__ import annotations

import os
import re
from pathlib import Path

import attrs
from twisted.trial.unittest import SynchronousTestCase

from prexy.cache.policy import CachePolicy
from prexy.codec import Compression
from prexy.config import (
    CACHE_KEYS,
    SITE,
    TOP,
    ConfigError,
    ConfigMemo,
    Timeouts,
    load_config,
    parse_config,
    parse_size,
    single_site_config,
)
from prexy.configschema import Key, Nested, Table, check_type, walk
from tests.cases import expand, parametrize, tmp_dir
from tests.pki import TestCA


def write(tmp: str, name: str, text: str) -> str:
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write(text)
    return path


GOOD = """
[server]
listen = ["tcp:8080:interface=127.0.0.1", "tcp6:8081"]
max_request_body = "10M"
default_site = "b"

[timeouts]
connect = 2
first_byte = 30.5

[sites.a]
hosts = ["A.example", "www.a.example."]
upstream = "https://a.origin.test/base/"
host_header = "upstream"
rules = ["a.rules"]

[sites.b]
upstream = "http://127.0.0.1:8001"
"""


#: A cached site; the parametrized cases append one key (line 5).
CACHED = "[cache]\nsize = '1M'\n[sites.a]\nupstream = 'http://x'\n"


@expand
class ConfigTests(SynchronousTestCase):
    def test_good_config_is_frozen_value(self) -> None:
        """A full config loads into nested frozen values with units converted and
        relative file names resolved against the config's directory."""
        tmp = str(tmp_dir(self))
        write(tmp, "a.rules", "")
        config = load_config(write(tmp, "prexy.toml", GOOD))
        assert config.listen == ("tcp:8080:interface=127.0.0.1", "tcp6:8081")
        assert config.max_request_body == 10 * 1024 * 1024
        assert config.timeouts == Timeouts(connect=2.0, first_byte=30.5)
        a = config.site("a")
        assert a.hosts == ("a.example", "www.a.example")
        assert (a.upstream.scheme, a.upstream.host, a.upstream.port, a.upstream.path) == ("https", "a.origin.test", 443, "/base")
        assert a.rules == (os.path.join(tmp, "a.rules"),)
        assert config.default_site == "b"
        with self.assertRaises(attrs.exceptions.FrozenInstanceError):
            config.listen = ()  # type: ignore[misc]

    @parametrize(
        "text, line, key, reason",
        [
            ("[sites.a]\nupstream = 'ftp://x'\n", 2, "sites.a.upstream", "http:// or https://"),
            ("[server]\nlisten = []\n[sites.a]\nupstream = 'http://x'\n", 2, "server.listen", "non-empty"),
            ("[server]\nlisten = ['bogus:1']\n[sites.a]\nupstream = 'http://x'\n", 2, "server.listen", "unsupported endpoint"),
            ("[server]\nlisten = ['ssl:1:privateKey=k.pem:extraCertChain=c.pem']\n[sites.a]\nupstream = 'http://x'\n",
             2, "server.listen", "extraCertChain not supported on an ssl: listener"),
            ("[timeouts]\nconnect = 'soon'\n[sites.a]\nupstream = 'http://x'\n", 2, "timeouts.connect", "must be a float"),
            ("[sites.a]\nupstream = 'http://x'\nfrobnicate = 1\n", 3, "sites.a.frobnicate", "unknown key"),
            ("[sites.a]\nupstream = 'http://x'\nrules = ['missing.rules']\n", 3, "sites.a.rules", "no such file"),
            ("[server]\ndefault_site = 'zz'\n[sites.a]\nupstream = 'http://x'\n", 2, "server.default_site", "no site named"),
            ("[server]\nmax_request_body = '12 parsecs'\n[sites.a]\nupstream = 'http://x'\n", 2, "server.max_request_body", "not a size"),
            ("[sites.a]\nupstream = 'http://x'\nhosts=['h']\n[sites.b]\nupstream = 'http://y'\nhosts=['h']\n", 6, "sites.b.hosts", "already belongs"),
            ("[sites.a]\n", 1, "sites.a", "missing key 'upstream'"),
            ("", None, "sites", "at least one"),
            ("[server\nlisten = 1\n", 1, None, "TOML syntax"),
            (CACHED + "cache_ttl = -1\n", 5, "sites.a.cache_ttl", "must be 0 or more"),
            (CACHED + "cache_keep = 'long'\n", 5, "sites.a.cache_keep", "must be a float"),
            (CACHED + "cache_pass = ['(']\n", 5, "sites.a.cache_pass", "bad regular expression"),
            (CACHED + "cache_ignore_cookies = ['']\n", 5, "sites.a.cache_ignore_cookies", "not a cookie name pattern"),
            (CACHED + "purge_from = '127.0.0.1'\n", 5, "sites.a.purge_from", "list of strings"),
            (CACHED + "cache_max_object = 'big'\n", 5, "sites.a.cache_max_object", "not a size"),
            (CACHED + "cache_stale_if_error = -5\n", 5, "sites.a.cache_stale_if_error", "must be 0 or more"),
            (CACHED + "cache_targeted_field = 'Cache-Control'\n", 5, "sites.a.cache_targeted_field", ""),
            ("[sites.a]\nupstream = 'http://x'\nupgrade = ['web socket']\n", 3, "sites.a.upgrade", "protocol names"),
            ("[sites.a]\nupstream = 'http://x'\nupgrade = 'websocket'\n", 3, "sites.a.upgrade", "protocol names"),
            ("[timeouts]\ntunnel_idle = -1\n[sites.a]\nupstream = 'http://x'\n", 2, "timeouts.tunnel_idle", "0 (off) or more"),
            ("[server]\nhttp2 = 'yes'\n[sites.a]\nupstream = 'http://x'\n", 2, "server.http2", "must be a bool"),
            ("[limits]\nmax_request_line = 'wide'\n[sites.a]\nupstream = 'http://x'\n", 2, "limits.max_request_line", "not a size"),
            ("[limits]\nmax_header_line = 10\n[sites.a]\nupstream = 'http://x'\n", 2, "limits.max_header_line", "at least 256"),
            ("[limits]\nmax_request_head = '4k'\n[sites.a]\nupstream = 'http://x'\n", 2, "limits.max_request_head", "at least max_request_line"),
            ("[limits]\nmax_body = '4k'\n[sites.a]\nupstream = 'http://x'\n", 2, "limits.max_body", "unknown key"),
            ("[limits]\nmax_header_lines = 0\n[sites.a]\nupstream = 'http://x'\n", 2, "limits.max_header_lines", "from 1 to 100000"),
            ("[limits]\nmax_header_lines = '1k'\n[sites.a]\nupstream = 'http://x'\n", 2, "limits.max_header_lines", "must be a int"),
            ("[sites.a]\nupstream = 'http://x'\n[limits]\nmax_header_lines = 100.5\n", 4, "limits.max_header_lines", "must be a int"),
            ("[timeouts]\nclient_header = -1\n[sites.a]\nupstream = 'http://x'\n", 2, "timeouts.client_header", "0 (off) or more"),
            ("[sites.a]\nupstream = 'http://x'\nallow_trace = 'yes'\n", 3, "sites.a.allow_trace", "must be a bool"),
            ("[compression]\ngzip_level = 10\n[sites.a]\nupstream = 'http://x'\n", 2, "compression.gzip_level", "from 1 to 9"),
            ("[compression]\nbr_level = 'max'\n[sites.a]\nupstream = 'http://x'\n", 2, "compression.br_level", "must be a int"),
            ("[compression]\nzstd_level = 0\n[sites.a]\nupstream = 'http://x'\n", 2, "compression.zstd_level", "from 1 to 19"),
            ("[compression]\nlevel = 1\n[sites.a]\nupstream = 'http://x'\n", 2, "compression.level", "unknown key"),
            ("[compression]\nenabled = 1\n[sites.a]\nupstream = 'http://x'\n", 2, "compression.enabled", "must be a bool"),
            ("[compression]\ntypes = 'text/html'\n[sites.a]\nupstream = 'http://x'\n", 2, "compression.types", "list of media types"),
            ("[compression]\ntypes = ['html']\n[sites.a]\nupstream = 'http://x'\n", 2, "compression.types", "list of media types"),
            ("[compression]\nmin_length = 'tiny'\n[sites.a]\nupstream = 'http://x'\n", 2, "compression.min_length", "not a size"),
            ("compression = 1\n[sites.a]\nupstream = 'http://x'\n", 1, "compression", "must be a table"),
            ("[sites.a]\nupstream = 'http://x'\n[sites.a.compression]\nbr_level = 12\n", 4, "sites.a.compression.br_level", "from 0 to 11"),
            ("[sites.a]\nupstream = 'http://x'\ncompression = true\n", 3, "sites.a.compression", "must be a table"),
            # A size that is neither a string nor a whole number (once a TypeError out of the loader).
            ("[server]\nmax_request_body = 1.5\n[sites.a]\nupstream = 'http://x'\n", 2, "server.max_request_body", "not a size"),
            ("[cache]\nsize = [1]\n[sites.a]\nupstream = 'http://x'\n", 2, "cache.size", "not a size"),
            # A site's cache keys are checked whether or not it is cached.
            ("[sites.a]\nupstream = 'http://x'\ncache_ttl = 'long'\n", 3, "sites.a.cache_ttl", "must be a float"),
            ("[sites.a]\nupstream = 'http://x'\nredirect_status = 302\n", 3, "sites.a.redirect_status", "without 'map'"),
            ("[sites.a]\nupstream = 'http://x'\nmap = 'gone.map'\n", 3, "sites.a.map", "no such file"),
            ("[sites.a]\nupstream = 'http://x'\ncache = true\n", 3, "sites.a.cache", "needs a cache"),
            ("[sites.a]\nupstream = 'http://x'\nhosts = 'a.test'\n", 3, "sites.a.hosts", "list of host names"),
            ("[sites.a]\nupstream = 'http://x'\nupstream_ca = 'bad.toml'\n", 3, "sites.a.upstream_ca", "only applies to an https"),
            ("[acme]\nemail = 'a@b.example'\n[sites.a]\nupstream = 'http://x'\n", 1, "acme", "missing key 'directory'"),
            ("[http2]\nflood_window = 0\n[sites.a]\nupstream = 'http://x'\n", 2, "http2.flood_window", "more than 0"),
            ("[server]\nworkers = -1\n[sites.a]\nupstream = 'http://x'\n", 2, "server.workers", "0 or more"),
            ("include = ''\n[sites.a]\nupstream = 'http://x'\n", 1, "include", "glob pattern"),
            ("sites = 1\n", 1, "sites", "at least one"),
            ("include = 'x/*.toml'\nsites = 1\n", 2, "sites", "must be a table"),
        ],
    )
    def test_errors_name_file_line_key_reason(self, text: str, line: int | None, key: str | None, reason: str) -> None:
        """Each broken config is refused with where and why."""
        tmp = str(tmp_dir(self))
        path = write(tmp, "bad.toml", text)
        with self.assertRaises(ConfigError) as info:
            load_config(path)
        err = info.exception
        assert err.path == path
        assert err.line == line
        assert err.key == key
        assert reason in err.reason
        assert str(err).startswith(f"{path}:{line}:" if line else f"{path}:")

    def test_ssl_listen_gets_configured_certificate(self) -> None:
        """ssl: endpoints without privateKey= get the configured key and cert."""
        tmp = str(tmp_dir(self))
        issued = TestCA().issue("localhost")
        cert = write(tmp, "c:ert.pem", issued.chain_pem.decode())
        key = write(tmp, "key.pem", issued.key_pem.decode())
        config = parse_config(
            f"[server]\nlisten=['ssl:8443']\ntls_certificate={cert!r}\ntls_key={key!r}\n[sites.a]\nupstream='http://x'\n",
            os.path.join(tmp, "p.toml"),
        )
        (desc,) = config.listen_endpoints()
        assert desc.startswith("ssl:8443:privateKey=")
        assert "c\\:ert.pem" in desc

    def test_ssl_listen_without_key_is_refused(self) -> None:
        """An ssl: endpoint with no key anywhere is an error at load."""
        tmp = str(tmp_dir(self))
        with self.assertRaisesRegex(ConfigError, "tls_key"):
            parse_config("[server]\nlisten=['ssl:8443']\n[sites.a]\nupstream='http://x'\n", os.path.join(tmp, "p.toml"))

    def test_compression_server_default_and_site_keys(self) -> None:
        """[compression] is every site's; a site's own table overrides the
        keys it names and keeps the rest."""
        config = parse_config(
            "[compression]\nmin_length = '1k'\ngzip_level = 6\ntypes = ['text/html']\n"
            "[sites.a]\nupstream = 'http://x'\n"
            "[sites.b]\nupstream = 'http://y'\n[sites.b.compression]\nenabled = false\nbr_level = 9\n"
        )
        a, b = config.site("a").compression, config.site("b").compression
        assert config.compression == a
        assert (a.enabled, a.min_length, a.gzip_level, a.types) == (True, 1024, 6, ("text/html",))
        assert (b.enabled, b.min_length, b.gzip_level, b.br_level) == (False, 1024, 6, 9)
        assert parse_config("[sites.a]\nupstream = 'http://x'\n").site("a").compression == Compression()

    def test_sizes(self) -> None:
        """nginx-style size units."""
        assert [parse_size(x) for x in ("0", "8k", "8K", "1m", "2G", 5)] == [0, 8192, 8192, 1048576, 2 * 1024**3, 5]
        for bad in ("-1", "1.5m", "1t", True, 1.5, [1]):
            with self.assertRaises(ValueError):
                parse_size(bad)  # type: ignore[arg-type]

    def test_header_lines_limit(self) -> None:
        """``limits.max_header_lines`` is a count (default 100), beside the
        head sizes, which stay sizes."""
        assert parse_config("[sites.a]\nupstream = 'http://x'\n").limits.max_header_lines == 100
        limits = parse_config("[limits]\nmax_header_lines = 250\nmax_header_line = '4k'\n[sites.a]\nupstream = 'http://x'\n").limits
        assert (limits.max_header_lines, limits.max_header_line) == (250, 4096)

    def test_single_site_command_line(self) -> None:
        """--listen/--upstream make a one-site config; a bad URL is refused."""
        config = single_site_config(["tcp:9000"], "http://127.0.0.1:8001")
        assert config.listen == ("tcp:9000",)
        assert config.site("default").upstream.port == 8001
        with self.assertRaisesRegex(ConfigError, "--upstream"):
            single_site_config(["tcp:9000"], "127.0.0.1:8001")

    def test_site_cache_keys_load_into_the_cache_policy(self) -> None:
        """A site's cache keys become the cache core's own ``CachePolicy``; keys
        left out keep its defaults (the documented ones)."""
        tmp = str(tmp_dir(self))
        config = parse_config(
            CACHED + "cache_ttl = 60\ncache_pass = ['^/cart']\ncache_max_object = '1M'\n"
            "[sites.b]\nupstream = 'http://y'\ncache = false\n",
            os.path.join(tmp, "p.toml"),
        )
        assert config.site("a").cache == CachePolicy(default_ttl=60, pass_rules=("^/cart",), max_object_size=1024**2)
        assert config.site("a").cache.keep == CachePolicy().keep == 300
        other = parse_config(CACHED + "cache_stale_if_error = 30\ncache_targeted_field = 'Acme-Cache-Control'\n",
                             os.path.join(tmp, "q.toml")).site("a").cache
        assert (other.stale_if_error, other.targeted_cache_control) == (30.0, "Acme-Cache-Control")
        assert config.site("b").cache is None
        assert single_site_config(["tcp:9000"], "http://x", cache_size=1024).site("default").cache == CachePolicy()

    def test_upgrade_protocols(self) -> None:
        """``upgrade`` names protocols case-insensitively; default websocket;
        [] turns tunnels off; tunnel_idle is a timeout like the others."""
        tmp = str(tmp_dir(self))
        config = parse_config(
            "[timeouts]\ntunnel_idle = 300\n[sites.a]\nupstream = 'http://x'\nupgrade = ['WebSocket', 'foo']\n"
            "[sites.b]\nupstream = 'http://y'\nupgrade = []\n[sites.c]\nupstream = 'http://z'\n",
            os.path.join(tmp, "u.toml"),
        )
        assert config.site("a").upgrade == frozenset({b"websocket", b"foo"})
        assert config.site("b").upgrade == frozenset()
        assert config.site("c").upgrade == frozenset({b"websocket"})
        assert config.timeouts.tunnel_idle == 300.0


class IncludeTests(SynchronousTestCase):
    """``include``: sites in files of their own, each error named
    with the site file's own path and line."""

    def setUp(self) -> None:
        self.tmp = str(tmp_dir(self))
        os.mkdir(os.path.join(self.tmp, "sites.d"))
        write(self.tmp, "sites.d/a.rules", "replace_filter 'a' 'b' g;\n")
        self.main = write(
            self.tmp, "prexy.toml",
            'include = "sites.d/*.toml"\n[server]\ndefault_site = "b"\n[sites.main]\nupstream = "http://m"\n',
        )

    def site_file(self, name: str, text: str) -> str:
        return write(self.tmp, f"sites.d/{name}", text)

    def refused(self, memo: ConfigMemo | None = None) -> ConfigError:
        with self.assertRaises(ConfigError) as caught:
            load_config(self.main, memo)
        return caught.exception

    def test_sites_from_several_files(self) -> None:
        """Every [sites.NAME] of every matching file joins the main file's
        sites (main file first, then the files in name order, a file's
        sites in its order); relative names resolve against the site file's
        own folder; ``included`` lists the files."""
        b = self.site_file("b.toml", '[sites.b]\nupstream = "http://b"\nrules = "a.rules"\nhosts = ["b.test"]\n')
        a = self.site_file("a.toml", '[sites.a1]\nupstream = "http://a1"\n[sites.a2]\nupstream = "http://a2"\n')
        self.site_file("notes.txt", "not toml, not matched")
        config = load_config(self.main)
        assert [s.name for s in config.sites] == ["main", "a1", "a2", "b"]
        assert config.site("b").rules == (os.path.join(self.tmp, "sites.d", "a.rules"),)
        assert config.default_site == "b"
        assert config.included == (a, b)

    def test_list_of_patterns(self) -> None:
        """``include`` may be a list of patterns; a file two patterns match is read once."""
        self.site_file("a.toml", '[sites.a]\nupstream = "http://a"\n')
        write(self.tmp, "prexy.toml", 'include = ["sites.d/*.toml", "sites.d/a.toml"]\n[sites.m]\nupstream = "http://m"\n')
        assert [s.name for s in load_config(self.main).sites] == ["m", "a"]

    def test_errors_name_the_site_file_and_line(self) -> None:
        """A bad key in a site file is reported with that file's path and
        line, as is a TOML syntax error there and a missing rules file."""
        self.site_file("a.toml", '[sites.a]\nupstream = "http://a"\n')
        bad = self.site_file("b.toml", '# site b\n\n[sites.b]\nupstream = "ftp://b"\n')
        error = self.refused()
        assert (error.path, error.line, error.key) == (bad, 4, "sites.b.upstream")
        assert "http:// or https://" in error.reason
        self.site_file("b.toml", '[sites.b]\nupstream = "http://b"\nhosts = [1 2]\n')
        error = self.refused()
        assert (error.path, error.line) == (bad, 3) and "TOML syntax" in str(error)
        self.site_file("b.toml", '[sites.b]\nupstream = "http://b"\nrules = "gone.rules"\n')
        error = self.refused()
        assert (error.path, error.line, error.key) == (bad, 3, "sites.b.rules")
        assert str(error).startswith(f"{bad}:3: sites.b.rules: no such file: ")

    def test_a_site_defined_twice_names_both_places(self) -> None:
        """The same site name in two files (or in the main file and a site
        file) is refused naming the second place, with the first one in the
        reason."""
        first = self.site_file("a.toml", '\n[sites.x]\nupstream = "http://a"\n')
        second = self.site_file("b.toml", '[sites.y]\nupstream = "http://y"\n\n[sites.x]\nupstream = "http://b"\n')
        error = self.refused()
        assert str(error) == f"{second}:4: sites.x: site 'x' is already defined at {first}:2"
        os.remove(first)
        self.site_file("b.toml", '[sites.main]\nupstream = "http://b"\n')
        error = self.refused()
        assert str(error) == f"{second}:1: sites.main: site 'main' is already defined at {self.main}:4"

    def test_a_host_of_two_sites_names_the_other_file(self) -> None:
        """Two sites in different files answering the same host: refused where
        the second says it, naming the first site and its file."""
        first = self.site_file("a.toml", '[sites.a]\nupstream = "http://a"\nhosts = ["h.test"]\n')
        second = self.site_file("b.toml", '[sites.b]\nupstream = "http://b"\nhosts = ["H.test"]\n')
        error = self.refused()
        assert (error.path, error.line) == (second, 3)
        assert error.reason == f"host 'h.test' already belongs to site 'a' ({first})"

    def test_a_pattern_matching_nothing_is_refused(self) -> None:
        """An empty glob (a folder moved, a typo) is refused with the main
        file's line, so that a reload never drops every site in silence."""
        error = self.refused()
        assert (error.path, error.line, error.key) == (self.main, 1, "include")
        assert error.reason == "'sites.d/*.toml' matches no file"

    def test_bad_include_values_and_files(self) -> None:
        """``include`` must be a pattern or a list of them; an included file
        holds [sites.NAME] tables only, and at least one."""
        write(self.tmp, "prexy.toml", "include = 3\n[sites.m]\nupstream = 'http://m'\n")
        error = self.refused()
        assert (error.line, error.key) == (1, "include") and "glob pattern" in error.reason
        write(self.tmp, "prexy.toml", 'include = "sites.d/*.toml"\n[sites.m]\nupstream = "http://m"\n')
        bad = self.site_file("a.toml", '[sites.a]\nupstream = "http://a"\n[server]\nworkers = 2\n')
        error = self.refused()
        assert (error.path, error.line, error.key) == (bad, 3, "server")
        assert error.reason == "an included file holds [sites.NAME] tables only"
        self.site_file("a.toml", "# nothing yet\n")
        error = self.refused()
        assert (error.path, error.key) == (bad, "sites")

    def test_only_included_sites(self) -> None:
        """The main file may hold no site at all when its include brings some."""
        write(self.tmp, "prexy.toml", 'include = "sites.d/*.toml"\n')
        self.site_file("a.toml", '[sites.a]\nupstream = "http://a"\n')
        config = load_config(self.main)
        assert [s.name for s in config.sites] == ["a"] and config.default_site == "a"

    def test_memo_reuses_unchanged_site_files(self) -> None:
        """Loaded again with the same ``ConfigMemo``, the sites of unchanged
        files are the very same values (not parsed again); a changed file's
        sites are new; the result equals a load without the memo."""
        self.site_file("a.toml", '[sites.a]\nupstream = "http://a"\nrules = "a.rules"\n')
        self.site_file("b.toml", '[sites.b]\nupstream = "http://b"\n')
        memo = ConfigMemo()
        first = load_config(self.main, memo)
        self.site_file("b.toml", '[sites.b]\nupstream = "http://b2"\n')
        second = load_config(self.main, memo)
        assert second.site("a") is first.site("a")
        assert second.site("b") is not first.site("b")
        assert str(second.site("b").upstream) == "http://b2"
        assert second == load_config(self.main)
        # A new [cache] size changes what every site inherits: none is reused.
        with open(self.main, "a") as f:
            f.write('[cache]\nsize = "1M"\n')
        third = load_config(self.main, memo)
        assert third.site("a") is not second.site("a") and third.site("a").cache is not None

    def test_memo_still_refuses_a_vanished_rules_file(self) -> None:
        """An unchanged site file whose rules file was deleted is refused on
        the next load with the memo too, with its key and line."""
        path = self.site_file("a.toml", '[sites.a]\nupstream = "http://a"\nrules = "a.rules"\n')
        self.site_file("b.toml", '[sites.b]\nupstream = "http://b"\n')
        memo = ConfigMemo()
        load_config(self.main, memo)
        os.remove(os.path.join(self.tmp, "sites.d", "a.rules"))
        error = self.refused(memo)
        assert (error.path, error.line, error.key) == (path, 3, "sites.a.rules")

    def test_memo_touched_file_same_text(self) -> None:
        """A site file whose status changed but whose text did not (touched,
        copied over with the same bytes) keeps its sites; one rewritten with
        other bytes of the same length does not."""
        path = self.site_file("a.toml", '[sites.a]\nupstream = "http://a"\n')
        self.site_file("b.toml", '[sites.b]\nupstream = "http://b"\n')
        memo = ConfigMemo()
        first = load_config(self.main, memo)
        os.utime(path, ns=(1, 1))
        assert load_config(self.main, memo).site("a") is first.site("a")
        self.site_file("a.toml", '[sites.a]\nupstream = "http://b"\n')
        assert str(load_config(self.main, memo).site("a").upstream) == "http://b"


DOCS = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def documented_keys(text: str) -> set[tuple[str, str]]:
    """(table, key) for each key of the reference block (the first toml
    block) of docs/configuration.md, set (``key =``) or shown commented out
    (``# key =``); a site's name reads ``NAME``; a top-level table counts as
    a key of the top level ('')."""
    block = text.split("```toml\n", 1)[1].split("```", 1)[0]
    table = ""
    found = set()
    for line in block.splitlines():
        header = re.match(r"\s*\[([^\]]+)\]", line)
        if header:
            parts = header.group(1).split(".")
            if parts[0] == "sites" and len(parts) > 1:
                parts[1] = "NAME"
            table = ".".join(parts)
            found.add(("", parts[0]))
            continue
        key = re.match(r"\s*(?:#\s*)?([A-Za-z0-9_]+)\s*=", line)
        if key:
            found.add((table, key.group(1)))
    return found


class DeclaredKeysTests(SynchronousTestCase):
    """The tables of keys (``prexy.config.TOP`` and what it nests) are the
    one declaration of what a file may hold."""

    def declared(self) -> list[tuple[str, Key, Table]]:
        """(table name, key, the table declaring it) for every declared key."""
        tables: dict[str, Table] = {"": TOP}
        out = []
        for name, key in walk(TOP):
            out.append((name, key, tables[name]))
            nested = key.table
            if nested is not None:
                inner = f"{name}.{key.name}" if name else key.name
                each = isinstance(key.convert, Nested) and key.convert.each
                tables[inner + (".NAME" if each else "")] = nested
        return out

    def test_every_key_is_documented(self) -> None:
        """Each key the loader accepts is in docs/configuration.md's
        reference block, under its table; a table used in two places (a
        site's [compression]) is documented once."""
        documented = documented_keys(DOCS.read_text(encoding="utf-8"))
        by_table: dict[int, set[str]] = {}
        for name, key, table in self.declared():
            if (name, key.name) in documented:
                by_table.setdefault(id(table), set()).add(key.name)
        missing = [f"{name}.{key.name}" if name else key.name for name, key, table in self.declared()
                   if key.name not in by_table.get(id(table), set())]
        assert not missing, f"keys not in docs/configuration.md's reference block: {missing}"

    def test_every_documented_key_is_accepted(self) -> None:
        """Each key of the reference block is one the loader declares."""
        declared = {(name, key.name) for name, key, _ in self.declared()}
        unknown = sorted(documented_keys(DOCS.read_text(encoding="utf-8")) - declared)
        assert not unknown, f"documented keys the loader refuses: {unknown}"

    def test_every_key_fills_a_field_of_its_table_s_value(self) -> None:
        """A table with a target class: each key's field is one of that
        class's (the first part of a dotted one, a part the loader builds)."""
        for name, key, table in self.declared():
            if table.target is not None:
                assert key.field.partition(".")[0] in attrs.fields_dict(table.target), (name, key)

    def test_unknown_keys_list_the_declared_ones(self) -> None:
        """The error for an unknown key lists the table's keys, in the
        order they are declared."""
        with self.assertRaises(ConfigError) as info:
            parse_config("[sites.a]\nupstream = 'http://x'\nfrobnicate = 1\n")
        assert info.exception.reason == f"unknown key (allowed: {', '.join(k.name for k in SITE.keys)})"

    def test_cache_keys_come_from_the_site_table(self) -> None:
        """CACHE_KEYS (file key -> CachePolicy field) is read off the site's
        declarations: every field is the policy's."""
        assert CACHE_KEYS["cache_ttl"] == "default_ttl"
        assert set(CACHE_KEYS.values()) <= set(attrs.fields_dict(CachePolicy))
        assert set(CACHE_KEYS) == {k.name for k in SITE.keys if k.field.startswith("cache.")}

    def test_a_table_declares_a_key_once(self) -> None:
        """Declaring one key twice in a table is a mistake caught at import."""
        with self.assertRaises(ValueError):
            Table("t", (Key("a", lambda v, c, k: v), Key("a", lambda v, c, k: v)))

    def test_types(self) -> None:
        """A whole number is a float where a float is asked for; a bool is
        never a number."""
        assert check_type(3, float) == 3.0 and isinstance(check_type(3, float), float)
        for value, kind in ((True, int), (True, float), (1, bool), ("1", int)):
            with self.assertRaises(ValueError):
                check_type(value, kind)
