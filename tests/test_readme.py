"""The README's first configuration loads as written (both of its files)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from prexy.config import load_config
from prexy.runtime import build_runtime
from tests.cases import tmp_dir

README = Path(__file__).resolve().parent.parent / "README.md"


def blocks(language: str) -> list[str]:
    """The README's fenced blocks of ``language``."""
    text = README.read_text(encoding="utf-8")
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.M | re.S)


class FirstConfigurationTests(SynchronousTestCase):
    def test_it_loads_and_its_rules_compile(self) -> None:
        (config_text,) = blocks("toml")
        (rules_text,) = blocks("nginx")
        directory = tmp_dir(self)
        with open(os.path.join(directory, "prexy.toml"), "w", encoding="utf-8") as f:
            f.write(config_text)
        with open(os.path.join(directory, "clone.rules"), "w", encoding="utf-8") as f:
            f.write(rules_text)
        config = load_config(os.path.join(directory, "prexy.toml"))
        runtime = build_runtime(config, check=True)
        site = runtime.site_named("clone")
        assert site is not None and site.rules is not None
        from prexy.substitution.transducer import Transducer

        page = b'<a href="https://www.original.example/x">x</a><script>ga("UA-12345-1")</script>'
        self.assertEqual(
            Transducer(site.rules).finish(page),
            b'<a href="https://www.clone.test/x">x</a><script>ga("UA-99999-9")</script>',
        )
