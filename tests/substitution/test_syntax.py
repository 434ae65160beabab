"""The syntax tree's one way to be walked: every node type has its visitor
method, ``walk`` goes parents first with children in order, and the
analyses built on the visitor give the documented answers."""

from __future__ import annotations

import typing

from twisted.trial.unittest import SynchronousTestCase

from prexy.substitution import analysis, syntax
from prexy.substitution.dialect import parse_sregex
from prexy.substitution.emit import to_regex_source
from prexy.substitution.syntax import Alt, Cat, Char, Group, Node, Repeat, Set, Visitor, walk


class _Count(Visitor[int]):
    """Counts the nodes of a tree (a visitor that handles every type)."""

    def visit_char(self, node: Char) -> int:
        return 1

    def visit_set(self, node: Set) -> int:
        return 1

    def visit_assert(self, node: syntax.Assert) -> int:
        return 1

    def visit_group(self, node: Group) -> int:
        return 1 + self.visit(node.child)

    def visit_cat(self, node: Cat) -> int:
        return 1 + sum(map(self.visit, node.items))

    def visit_alt(self, node: Alt) -> int:
        return 1 + sum(map(self.visit, node.items))

    def visit_repeat(self, node: Repeat) -> int:
        return 1 + self.visit(node.child)


class VisitorTests(SynchronousTestCase):
    """Visitor dispatch and walk order."""

    def test_every_node_type_has_a_method(self) -> None:
        """Each type of the Node union dispatches to a method the base declares."""
        for kind in typing.get_args(Node):
            method = syntax._METHOD[kind]
            self.assertTrue(callable(getattr(Visitor, method)), kind)

    def test_visit_dispatches_on_the_node_type(self) -> None:
        """A visitor sees every node once: its count equals walk's."""
        for pattern in (b"a", b"(a|bc)*d", b"^(?:x{2,3}?|[0-9]+)\\b$", b"((a)(b|c|))+"):
            tree = parse_sregex(pattern).tree
            self.assertEqual(_Count().visit(tree), len(list(walk(tree))), pattern)

    def test_unhandled_type_is_an_error(self) -> None:
        """A visitor that leaves a node type out fails loudly, not silently."""

        class OnlyChars(Visitor[int]):
            def visit_char(self, node: Char) -> int:
                return 1

        self.assertEqual(OnlyChars().visit(Group(1, Char(97))), 1)
        self.assertRaises(NotImplementedError, OnlyChars().visit, Set(frozenset(b"ab")))

    def test_walk_is_preorder(self) -> None:
        """walk gives a node before its children, children left to right."""
        tree = parse_sregex(b"(a|b)c*").tree
        kinds = [type(n).__name__ for n in walk(tree)]
        self.assertEqual(kinds, ["Cat", "Group", "Alt", "Char", "Char", "Repeat", "Char"])

    def test_walk_is_not_recursive(self) -> None:
        """walk keeps its own stack: a tree deeper than the recursion limit walks."""
        tree: Node = Char(97)
        for _ in range(5000):
            tree = Group(None, tree)
        self.assertEqual(sum(1 for _ in walk(tree)), 5001)


class AnalysisTests(SynchronousTestCase):
    """The analyses' documented examples, through the visitor."""

    def test_pathological_examples(self) -> None:
        """check_pathological's docstring: which shapes are refused."""
        for refused in (b"(a|a)+$", b"(a|ab)*c", b"(\\w+\\d+)+", b"(.*a){12}"):
            self.assertIsNotNone(analysis.check_pathological(parse_sregex(refused).tree), refused)
        for accepted in (b"(a+)+$", b"(foo|bar)+", b"(a+b+)+", b".*a"):
            self.assertIsNone(analysis.check_pathological(parse_sregex(accepted).tree), accepted)

    def test_widths_and_edges(self) -> None:
        """Widths, edge bytes and edge assertions of a few patterns."""
        tree = parse_sregex(b"^ab{2,3}(c|de)?\\b").tree
        self.assertEqual(analysis.min_width(tree), 3)
        self.assertEqual(analysis.max_width(tree), 6)
        self.assertEqual(analysis.bounded_width(tree), 6)
        self.assertEqual(analysis.first_bytes(tree), frozenset(b"a"))
        self.assertEqual(analysis.last_bytes(tree), frozenset(b"bce"))
        self.assertEqual(analysis.leading_asserts(tree), frozenset({"bol"}))
        self.assertEqual(analysis.trailing_asserts(tree), frozenset({"b"}))
        self.assertIsNone(analysis.max_width(parse_sregex(b"ab+").tree))
        self.assertEqual(analysis.repeat_bytes(parse_sregex(b"a[xy]+b*").tree), frozenset(b"xyb"))

    def test_prefixes(self) -> None:
        """literal_prefix stops at the first unfixed byte; pure_literal needs all."""
        self.assertEqual(analysis.literal_prefix(parse_sregex(b"UA-\\d+").tree), b"UA-")
        self.assertEqual(analysis.literal_prefix(parse_sregex(b"^(ab)c+d").tree), b"abc")
        self.assertEqual(analysis.pure_literal(parse_sregex(b"a(b)c").tree), b"abc")
        self.assertIsNone(analysis.pure_literal(parse_sregex(b"^abc").tree))
        self.assertIsNone(analysis.pure_literal(parse_sregex(b"abc", caseless=True).tree))

    def test_empty_loops(self) -> None:
        """Groups inside a repeat whose body can match empty."""
        tree = parse_sregex(b"(a)(?:(b)|(c)?)*").tree
        self.assertTrue(analysis.has_empty_loop(tree))
        self.assertEqual(analysis.empty_loop_groups(tree), frozenset({2, 3}))
        self.assertFalse(analysis.has_empty_loop(parse_sregex(b"(a)*").tree))

    def test_emission(self) -> None:
        """The regex source keeps capture groups and wraps alternations in a concatenation."""
        self.assertEqual(to_regex_source(parse_sregex(b"x(a|b)+y|z").tree), "x(a|b)+y|z")
        self.assertEqual(to_regex_source(parse_sregex(b"xa|by").tree), "xa|by")
        self.assertEqual(to_regex_source(parse_sregex(b"x(?:a|b)").tree), "x(?:a|b)")
