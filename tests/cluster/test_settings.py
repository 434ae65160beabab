"""The [cluster] table: Redis addresses parse to values, every bad value is
refused with the config file, its line, the key and the reason."""

from __future__ import annotations

import socket

from twisted.trial.unittest import SynchronousTestCase

from prexy.cluster.settings import ClusterConfig, RedisAddress
from prexy.config import ConfigError, parse_config

BASE = '[server]\nlisten = ["tcp:8080"]\n\n[sites.t]\nupstream = "http://127.0.0.1:9"\n\n[cluster]\n'


class RedisAddressTests(SynchronousTestCase):
    def test_tcp(self) -> None:
        """host, port and database come from a redis:// URL, with defaults."""
        self.assertEqual(RedisAddress.parse("redis://127.0.0.1:6380/3"), RedisAddress(host="127.0.0.1", port=6380, db=3))
        self.assertEqual(RedisAddress.parse("redis://r.example"), RedisAddress(host="r.example", port=6379, db=0))
        self.assertEqual(RedisAddress.parse("redis://[::1]:7000/"), RedisAddress(host="::1", port=7000))

    def test_credentials(self) -> None:
        """A password (and user) travel to AUTH, URL-decoded; repr hides the password."""
        a = RedisAddress.parse("redis://fleet:s%40cret@10.0.0.1/1")
        self.assertEqual((a.username, a.password, a.db), ("fleet", "s@cret", 1))
        self.assertNotIn("s@cret", repr(a))
        self.assertEqual(RedisAddress.parse("redis://:pw@h").password, "pw")

    def test_unix(self) -> None:
        """unix:///path, with ?db=N."""
        self.assertEqual(RedisAddress.parse("unix:///run/redis.sock"), RedisAddress(path="/run/redis.sock"))
        self.assertEqual(RedisAddress.parse("unix:///run/r.sock?db=2").db, 2)
        self.assertEqual(str(RedisAddress.parse("unix:///run/r.sock?db=2")), "unix:///run/r.sock?db=2")
        self.assertEqual(str(RedisAddress.parse("redis://h:1/4")), "redis://h:1/4")

    def test_refused(self) -> None:
        """Other schemes, no host, bad ports and databases, queries are refused."""
        for text in ("http://h", "redis://", "redis://h:x", "redis://h:99999", "redis://h/x", "redis://h/1?a=b",
                     "unix://relative", "unix:///p?x=1", "unix:///p?db=z", "h:6379", ""):
            with self.assertRaises(ValueError, msg=text):
                RedisAddress.parse(text)


class ClusterTableTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        """Only redis is required; the node is named after the host."""
        config = parse_config(BASE + 'redis = "redis://127.0.0.1:6379/0"\n', "/etc/prexy.toml")
        self.assertEqual(config.cluster, ClusterConfig(RedisAddress(host="127.0.0.1"), socket.gethostname()))
        self.assertEqual(config.cluster.stream, "prexy:log")
        self.assertEqual(config.cluster.channel, "prexy:events")
        self.assertEqual(config.cluster.nodes_key, "prexy:nodes")

    def test_no_table_no_cluster(self) -> None:
        """Without [cluster] a node is alone."""
        self.assertIsNone(parse_config(BASE.replace("[cluster]\n", ""), "/p.toml").cluster)

    def test_all_keys(self) -> None:
        """Every key of the table lands in the value."""
        text = BASE + (
            'redis = "unix:///run/redis.sock"\nnode = "edge-1.ams"\nkey = "shop"\nkeep = 3600\n'
            "max_entries = 5000\nstart_wait = 0.5\nconfirm_timeout = 2\n"
        )
        c = parse_config(text, "/p.toml").cluster
        assert c is not None
        self.assertEqual((c.node, c.key, c.keep, c.max_entries, c.start_wait, c.confirm_timeout),
                         ("edge-1.ams", "shop", 3600.0, 5000, 0.5, 2.0))
        self.assertEqual(c.stream, "shop:log")

    def test_errors_name_file_line_key(self) -> None:
        """Each bad value: ConfigError with the file, the line of the key and the reason."""
        line = BASE.count("\n") + 1
        cases = [
            ('redis = "http://h"\n', "cluster.redis", "redis:// or unix://"),
            ("redis = 5\n", "cluster.redis", "must be a str"),
            ('redis = "redis://h"\nnode = "a b"\n', "cluster.node", "letters"),
            ('redis = "redis://h"\nkey = ""\n', "cluster.key", "letters"),
            ('redis = "redis://h"\nkeep = 0\n', "cluster.keep", "at least 1"),
            ('redis = "redis://h"\nstart_wait = -1\n', "cluster.start_wait", "seconds"),
            ('redis = "redis://h"\nconfirm_timeout = true\n', "cluster.confirm_timeout", "seconds"),
            ('redis = "redis://h"\nmax_entries = 10\n', "cluster.max_entries", "at least 100"),
            ('redis = "redis://h"\nmax_entries = 1.5\n', "cluster.max_entries", "whole number"),
            ('redis = "redis://h"\nnodes = 3\n', "cluster.nodes", "unknown key"),
        ]
        for body, key, reason in cases:
            with self.assertRaises(ConfigError, msg=body) as caught:
                parse_config(BASE + body, "/etc/prexy.toml")
            err = caught.exception
            self.assertEqual((err.path, err.key), ("/etc/prexy.toml", key), body)
            self.assertIn(reason, err.reason, body)
            self.assertGreaterEqual(err.line or 0, line, body)

    def test_missing_redis(self) -> None:
        """A [cluster] without redis says what to write."""
        with self.assertRaises(ConfigError) as caught:
            parse_config(BASE + 'node = "a"\n', "/p.toml")
        self.assertEqual(caught.exception.key, "cluster")
        self.assertIn("needs redis", caught.exception.reason)

    def test_not_a_table(self) -> None:
        """cluster = "..." (not a table) is refused."""
        with self.assertRaises(ConfigError) as caught:
            parse_config('cluster = "redis://h"\n' + BASE.replace("[cluster]\n", ""), "/p.toml")
        self.assertEqual(caught.exception.key, "cluster")
