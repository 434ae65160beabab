"""Map files load as nginx's map block reads them: directives, includes, conflicts, errors."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from prexy.urlmap import MapError, UrlMap, load_map, parse_map
from tests.cases import expand, parametrize, tmp_dir


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="latin-1")
    return path


@expand
class LoaderTests(SynchronousTestCase):
    def test_default_and_no_default(self) -> None:
        """``default`` answers when nothing matches; without it the answer is empty."""
        assert parse_map("default /home; /a /b;").lookup("/x") == "/home"
        assert parse_map("/a /b;").lookup("/x") == ""

    def test_duplicate_default_is_an_error(self) -> None:
        """A second ``default`` is refused, as nginx refuses it."""
        with self.assertRaisesRegex(MapError, r'^m.map:2: duplicate default map parameter "default"'):
            parse_map("default a;\ndefault b;", "m.map")

    def test_escaped_keywords_are_plain_keys(self) -> None:
        """``\\default``, ``\\include`` and ``\\~x`` are exact keys with those names."""
        m = parse_map("default d; \\default dflt; \\include inc; \\~x tilde; hostnames x;")
        assert m.lookup("default") == "dflt"
        assert m.lookup("include") == "inc"
        assert m.lookup("~x") == "tilde"
        assert m.lookup("hostnames") == "x"  # with a value it is an entry, not the directive
        assert m.lookup("other") == "d"

    def test_volatile_is_accepted_and_ignored(self) -> None:
        """``volatile;`` changes nothing about lookups."""
        assert parse_map("volatile; /a /b;").lookup("/a") == "/b"

    @parametrize("text", ["/a;", "/a /b /c;", "default;", "include;"])
    def test_wrong_parameter_count(self, text: str) -> None:
        """Statements other than hostnames/volatile need exactly a key and a value."""
        with self.assertRaisesRegex(MapError, "invalid number of the map parameters"):
            parse_map(text, "m.map")

    def test_duplicate_exact_key_is_refused(self) -> None:
        """nginx refuses a repeated exact key ("conflicting parameter", ngx_hash_add_key
        returns NGX_BUSY) rather than keeping the first or the last; so do we, and
        keys differing only in case are the same key."""
        with self.assertRaises(MapError) as info:
            parse_map("/a /1;\n/b /2;\n/A /3;\n", "m.map")
        assert str(info.exception) == 'm.map:3: conflicting parameter "/A"'
        assert info.exception.line == 3 and info.exception.text == "/A"

    def test_duplicate_regexes_are_allowed_first_wins(self) -> None:
        """Regexes are not deduplicated: the first in file order answers."""
        assert parse_map("~^/a 1; ~^/a 2;").lookup("/a") == "1"

    def test_bad_regex_is_a_load_error_with_location(self) -> None:
        """A regex that does not compile fails the load, naming file, line and the regex."""
        with self.assertRaises(MapError) as info:
            parse_map("/ok /x;\n\n~^/(a  /b;\n", "old.map")
        err = info.exception
        assert (err.filename, err.line, err.text, err.reason) == ("old.map", 3, "~^/(a", "invalid regex")
        assert str(err).startswith('old.map:3: invalid regex "~^/(a": missing')

    @parametrize(
        "regex",
        [
            "~a)", "~[a", '"~a{3,2}"', "~(?<n>a)(?<n>b)", r"~\k<nope>", "~(?<1a>x)",
            r"~\y", r"~x\\\\\\", "~(?z)", r"~[z-a]", r"~[\d-z]", "~[[:alpha:]-z]", "~[:alpha:]",
            "~[[:nope:]]", "~(?<=a+)b", "~(?<=x(a|bc))d", "~(*UTF)a", "~(?J)(?<n>a)|(?<n>b)", "~(?^-i)a",
        ],
    )
    def test_invalid_regexes_rejected(self, regex: str) -> None:
        """PCRE2 syntax errors (as nginx 1.22 reports them) and the few PCRE options not
        supported ((*UTF), (?J)) are load errors."""
        with self.assertRaisesRegex(MapError, "invalid regex"):
            parse_map(f"{regex} v;", "m.map")

    def test_unquoted_brace_in_regex_is_a_token_error(self) -> None:
        """As in nginx, a regex containing ``{`` must be quoted; unquoted it ends the token."""
        with self.assertRaisesRegex(MapError, 'unexpected "{"'):
            parse_map("~^/a{2} v;", "m.map")
        assert parse_map('"~^/a{2}$" v;').lookup("/aa") == "v"

    def test_empty_regex_matches_every_nonempty_key(self) -> None:
        """``~`` and ``~*`` alone are empty patterns: they match any key except the empty one."""
        m = parse_map("default d; ~* any;")
        assert m.lookup("/x") == "any"
        assert m.lookup("") == "d"

    def test_many_regexes_sharing_a_shape_still_catch_one_bad(self) -> None:
        """Validation by shape does not let a bad regex hide among good ones of the same look."""
        lines = [f"~^/p/{i}\\b(\\?[^/]*)*/?$ /;" for i in range(50)]
        lines.insert(30, "~^/p/x\\b(\\?[^/]*)*/?$( /;")
        with self.assertRaises(MapError) as info:
            parse_map("\n".join(lines), "m.map")
        assert info.exception.line == 31

    @parametrize(
        ("value", "reason"),
        [("/a$", "invalid variable name"), ("$/x", "invalid variable name"),
         ("${x", 'the closing bracket in "x" variable is missing'), ("${}", "invalid variable name"),
         ("$0", 'unknown "0" variable'), ("${12}", 'unknown "12" variable')],
    )
    def test_bad_values_are_errors(self, value: str, reason: str) -> None:
        """Values nginx cannot compile (a ``$`` not followed by a name) are load errors."""
        with self.assertRaisesRegex(MapError, reason):
            parse_map(f'/k "{value}";', "m.map")

    def test_include_relative_to_including_file(self) -> None:
        """``include`` resolves against the including file's directory, nested includes too,
        and entries keep their place in file order."""
        tmp_path = tmp_dir(self)
        main = _write(tmp_path / "main.map", "~^/a first;\ninclude sub/one.map;\n~^/ab last;\n")
        _write(tmp_path / "sub" / "one.map", "include two.map;\n/x x;\n")
        _write(tmp_path / "sub" / "two.map", "~^/ab middle;\n")
        m = load_map(main)
        assert m.lookup("/ab") == "first"
        assert m.lookup("/x") == "x"
        assert [os.path.basename(f.path) for f in m.source_files] == ["main.map", "one.map", "two.map"]
        assert all(f.mtime > 0 for f in m.source_files)
        assert m.entry_count == 4

    def test_include_glob_in_sorted_order(self) -> None:
        """Shell wildcards in ``include`` expand in sorted order; no match is not an error;
        the searched directory is watched too (a new file changes its mtime)."""
        tmp_path = tmp_dir(self)
        main = _write(tmp_path / "main.map", "include parts/*.map;\ninclude none/*.map;\n")
        _write(tmp_path / "parts" / "b.map", "~^/k b;\n")
        _write(tmp_path / "parts" / "a.map", "~^/k a;\n")
        m = load_map(main)
        assert m.lookup("/k") == "a"
        watched = [os.path.relpath(f.path, tmp_path) for f in m.source_files]
        assert watched == ["main.map", "parts", "parts/a.map", "parts/b.map"]

    def test_include_cycle_is_an_error(self) -> None:
        """A file that includes itself (directly or not) is reported, not recursed forever."""
        tmp_path = tmp_dir(self)
        main = _write(tmp_path / "a.map", "/a a;\ninclude b.map;\n")
        _write(tmp_path / "b.map", "include a.map;\n")
        with self.assertRaises(MapError) as info:
            load_map(main)
        assert info.exception.reason == "include cycle"
        assert info.exception.filename.endswith("b.map") and info.exception.line == 1

    def test_missing_include_names_the_including_line(self) -> None:
        """A missing included file is an error at the include's file and line."""
        tmp_path = tmp_dir(self)
        main = _write(tmp_path / "a.map", "/a a;\n\ninclude nope.map;\n")
        with self.assertRaises(MapError) as info:
            load_map(main)
        assert info.exception.line == 3 and info.exception.reason == "cannot open"
        assert str(info.exception).startswith(f"{main}:3: cannot open")

    def test_missing_map_file(self) -> None:
        """Loading a file that does not exist is a MapError too."""
        tmp_path = tmp_dir(self)
        with self.assertRaises(MapError) as info:
            load_map(tmp_path / "absent.map")
        assert str(info.exception).startswith(f'{tmp_path / "absent.map"}: cannot open "')

    def test_error_in_included_file_names_that_file(self) -> None:
        """Errors inside an included file carry that file's name and line."""
        tmp_path = tmp_dir(self)
        main = _write(tmp_path / "a.map", "include b.map;\n")
        _write(tmp_path / "b.map", "/x x;\n~(  y;\n")
        with self.assertRaises(MapError) as info:
            load_map(main)
        assert info.exception.filename.endswith("b.map") and info.exception.line == 2

    def test_parse_map_base_dir(self) -> None:
        """parse_map resolves includes against base_dir when given."""
        tmp_path = tmp_dir(self)
        _write(tmp_path / "inc.map", "/i i;\n")
        assert parse_map("include inc.map;", "<text>", str(tmp_path)).lookup("/i") == "i"

    def test_bytes_are_latin1(self) -> None:
        """Files are read byte for byte: a UTF-8 key matches the same bytes seen as latin-1."""
        tmp_path = tmp_dir(self)
        path = tmp_path / "u.map"
        path.write_bytes("/caf\u00e9 /cafe;\n".encode())
        key = "/caf\u00e9".encode().decode("latin-1")
        assert load_map(path).lookup(key) == "/cafe"

    def test_urlmap_is_immutable(self) -> None:
        """A loaded map cannot be changed in place (swap a new one in instead)."""
        m = parse_map("/a /b;")
        assert isinstance(m, UrlMap)
        with self.assertRaises(AttributeError):
            m.default = "x"

    def test_maperror_pickles(self) -> None:
        """MapError survives pickling (it may cross a process boundary to a master)."""
        err = MapError("f.map", 3, "~(", "invalid regex", "missing )")
        again = pickle.loads(pickle.dumps(err))
        assert str(again) == str(err) == 'f.map:3: invalid regex "~(": missing )'

    def test_garbage_collector_state_is_restored(self) -> None:
        """Loading pauses the cyclic GC and puts it back as it was, also after an error."""
        import gc

        assert gc.isenabled()
        parse_map("/a /b;")
        assert gc.isenabled()
        with self.assertRaises(MapError):
            parse_map("~( x;")
        assert gc.isenabled()
        gc.disable()
        try:
            parse_map("/a /b;")
            assert not gc.isenabled()
        finally:
            gc.enable()
