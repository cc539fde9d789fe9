"""Searching a subtree: ``find_all`` (source order, without rebuilding nodes) and ``contains``.

Whitespace, comments and punctuation (``_TRIVIA``) are never walked: no search finds one."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Optional, TypeVar, Union, cast

import libcst as cst
import libcst.matchers as m

_N = TypeVar("_N", bound=cst.CSTNode)
# What find_all looks for: a libcst matcher, or a MatchIfTrue tested on every node.
NodeMatcher = Union[m.BaseMatcherNode, m.MatchIfTrue[cst.CSTNode]]


def visit_below(node: _N, transformer: cst.CSTTransformer) -> _N:
    """``node.visit(transformer)`` for a transformer that neither removes nor
    flattens ``node`` (libcst types the result as possibly either) and edits
    what lies below it (callers pass a node above their matches)."""
    return cast(_N, node.visit(transformer))


def contains(node: cst.CSTNode, matcher: NodeMatcher) -> bool:
    return bool(find_all(node, matcher))


def find_all(node: cst.CSTNode, matcher: NodeMatcher, within: Optional[m.BaseMatcherNode] = None) -> list[cst.CSTNode]:
    """Nodes under ``node`` (itself included) matching ``matcher``, in source
    order; only inside ``within`` nodes when given. Same result as libcst's
    ``m.findall``, which rebuilds every node it visits and so costs about as
    much as a parse; this walks the dataclass fields and only calls
    ``m.matches`` on nodes of the matcher's type."""
    if within is not None:
        return [hit for outer in find_all(node, within) for hit in find_all(outer, matcher)]
    nodes, by_type = _index(node)
    if isinstance(matcher, m.MatchIfTrue):  # as m.replace tests one on each node (m.matches takes none)
        return [n for n in nodes if matcher.func(n)]
    types = _types_of(matcher)
    candidates: Sequence[cst.CSTNode]
    if types is None:
        candidates = nodes  # MatchIfTrue, ~X, ...: test every node
    elif len(types) == 1:
        candidates = by_type.get(next(iter(types)), ())
    else:  # OneOf: the nodes of its options' types, still in source order
        candidates = [n for n in nodes if type(n) in types]
    needs = _needs_of(matcher)
    if needs is not None:  # cheap tests first: m.matches only where they pass
        candidates = [n for n in candidates if _meets(n, needs)]
    return [n for n in candidates if m.matches(n, matcher)]


# id(matcher) -> (matcher, what was worked out of it): matchers are module
# constants mostly; the entry holds the matcher, so its id stays valid.
_TYPES: dict[int, tuple] = {}  # the node types it can match, or None
_NEEDS: dict[int, tuple] = {}  # _needs of it


def find_all_of(
    kind: type[_N], node: cst.CSTNode, matcher: NodeMatcher, within: Optional[m.BaseMatcherNode] = None
) -> list[_N]:
    """``find_all`` for a matcher of one kind of node: its hits, typed as that kind."""
    return [hit for hit in find_all(node, matcher, within) if isinstance(hit, kind)]


def sole_call_in(branch: Optional[cst.If], matcher: NodeMatcher) -> Optional[tuple[cst.IndentedBlock, cst.Call]]:
    """``branch``'s indented body and the one call in it matching ``matcher``; None without
    the branch, for a one-line body, or when the body holds no such call or several."""
    if branch is None or not isinstance(branch.body, cst.IndentedBlock):
        return None
    calls = find_all_of(cst.Call, branch.body, matcher)
    return (branch.body, calls[0]) if len(calls) == 1 else None


def _remembered(cache: dict[int, tuple], matcher, work):
    hit = cache.get(id(matcher))
    if hit is not None and hit[0] is matcher:
        return hit[1]
    if len(cache) > 1024:
        cache.clear()
    value = work(matcher)
    cache[id(matcher)] = (matcher, value)
    return value


def _types_of(matcher) -> Optional[frozenset]:
    return _remembered(_TYPES, matcher, _matcher_types)


def _needs_of(matcher) -> Optional[tuple]:
    return _remembered(_NEEDS, matcher, _needs)


def _needs(matcher) -> Optional[tuple]:
    """What a node must have for ``m.matches(node, matcher)`` to hold, as far
    as cheap to test (None: nothing): ((field, str), ...) for fields the
    matcher gives as text, ((field, class name, needs), ...) for fields given
    as a node matcher (libcst compares text with ==, and a node matcher
    matches only a node of its class's name). A OneOf needs what one of its
    options does: ("or", (needs, ...))."""
    inner = getattr(matcher, "matcher", None)
    if type(matcher).__name__ == "_ExtractMatchingNode" and inner is not None:
        return _needs(inner)
    if isinstance(matcher, m.TypeOf):
        return None
    if isinstance(matcher, m.OneOf):
        options = tuple(_needs(option) for option in matcher.options)
        return None if any(o is None for o in options) else ("or", options)
    if isinstance(matcher, m.AllOf):
        return None
    if not isinstance(matcher, m.BaseMatcherNode) or not isinstance(getattr(cst, type(matcher).__name__, None), type):
        return None
    needs: list[tuple] = []
    for f in dataclasses.fields(matcher):  # type: ignore[arg-type]  # every libcst node matcher is a dataclass; libcst types them as BaseMatcherNode
        if f.name in ("metadata", "_metadata"):
            continue
        wanted = getattr(matcher, f.name)
        inner = getattr(wanted, "matcher", None)
        if type(wanted).__name__ == "_ExtractMatchingNode" and inner is not None:
            wanted = inner
        if isinstance(wanted, str):
            needs.append((f.name, wanted))
        elif (
            isinstance(wanted, m.BaseMatcherNode)
            and not isinstance(wanted, (m.OneOf, m.AllOf, m.TypeOf))
            and isinstance(getattr(cst, type(wanted).__name__, None), type)
        ):
            needs.append((f.name, type(wanted).__name__, _needs(wanted) or ()))
    return tuple(needs) or None


def _meets(node, needs: tuple) -> bool:
    if needs and needs[0] == "or":
        return any(o == () or _meets(node, o) for o in needs[1])
    for need in needs:
        value = getattr(node, need[0], None)
        if len(need) == 2:
            if value != need[1]:
                return False
        elif not isinstance(value, (list, tuple, str)):  # a sequence: libcst matches it otherwise
            if type(value).__name__ != need[1] or (need[2] and not _meets(value, need[2])):
                return False
    return True


def _matcher_types(matcher) -> Optional[frozenset]:
    """The libcst node types ``m.matches(node, matcher)`` can be true for
    (a superset), None for any: libcst matches a node only against a matcher
    of its class's name; a OneOf matches what one of its options does, an
    AllOf what all do, a saved matcher what it wraps."""
    if isinstance(matcher, m.TypeOf):
        return None
    if isinstance(matcher, (m.OneOf, m.AllOf)):
        options = [_matcher_types(option) for option in matcher.options]
        if isinstance(matcher, m.OneOf):
            return (
                None if any(t is None for t in options) else frozenset().union(*(t for t in options if t is not None))
            )
        known = [t for t in options if t is not None]
        return frozenset.intersection(*known) if known else None
    inner = getattr(matcher, "matcher", None)
    if type(matcher).__name__ == "_ExtractMatchingNode" and inner is not None:
        return _matcher_types(inner)
    wanted = getattr(cst, type(matcher).__name__, None)
    if isinstance(wanted, type) and issubclass(wanted, cst.CSTNode):
        return frozenset((wanted,))
    return None


# Codemods query the same method many times (detect, transform, postcondition):
# remember the walk of the last few subtrees. CST nodes are immutable, so a
# node's walk never changes; the cache holds the node itself, so its id stays valid.
_INDEX: "OrderedDict[int, tuple]" = OrderedDict()


def _index(node: cst.CSTNode) -> tuple[list[cst.CSTNode], dict[type, list[cst.CSTNode]]]:
    hit = _INDEX.get(id(node))
    if hit is not None and hit[0] is node:
        _INDEX.move_to_end(id(node))
        return hit[1], hit[2]
    nodes = _nodes_under(node)
    by_type: dict[type, list[cst.CSTNode]] = {}
    for n in nodes:
        by_type.setdefault(type(n), []).append(n)
    _INDEX[id(node)] = (node, nodes, by_type)
    if len(_INDEX) > 256:
        _INDEX.popitem(last=False)
    return nodes, by_type


# The walks of functions and classes, kept apart from _INDEX and by identity
# too: a walk of a class or module splices in those of the functions in it,
# and a function's walk after its class's is found here. A transformed class
# shares its unchanged methods with the class it came from.
_UNITS = (cst.FunctionDef, cst.ClassDef)
_UNIT_WALKS: dict[int, tuple] = {}


def _nodes_under(node: cst.CSTNode) -> list[cst.CSTNode]:
    """``list(_walk(node))``, from the remembered walks of the functions and
    classes in it."""
    hit = _UNIT_WALKS.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    nodes: list[cst.CSTNode] = []
    stack = [node]
    while stack:
        current = stack.pop()
        if current is not node and type(current) in _UNITS:
            nodes.extend(_nodes_under(current))
            continue
        nodes.append(current)
        stack.extend(reversed(_children(current)))
    if type(node) in _UNITS:
        if len(_UNIT_WALKS) > 4096:
            _UNIT_WALKS.clear()
        _UNIT_WALKS[id(node)] = (node, nodes)
    return nodes


class _ChildOrder(cst.CSTVisitor):
    """Records the order in which libcst visits a node's direct children."""

    def __init__(self, root: cst.CSTNode) -> None:
        self.root, self.seen = root, dict[int, int]()

    def on_visit(self, node: cst.CSTNode) -> bool:
        if node is self.root:
            return True
        self.seen.setdefault(id(node), len(self.seen))
        return False


# (node type, fields holding nodes) -> those fields in libcst's visit order,
# which is source order (dataclass field order is not, e.g. Arg, FunctionDef).
_FIELD_ORDER: dict[tuple, tuple[str, ...]] = {}


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


# type -> 1 (a CST node), 2 (a list or tuple), 0 (anything else): isinstance
# against CSTNode, an ABC, cost a Python-level __instancecheck__ per field.
_KINDS: dict[type, int] = {}
# Whitespace, comments and punctuation: two thirds of a method's nodes, and
# no codemod looks for one, so the walks (and every search) leave them out.
_TRIVIA = (
    cst.BaseParenthesizableWhitespace,
    cst.TrailingWhitespace,
    cst.Newline,
    cst.EmptyLine,
    cst.Comment,
    cst.Dot,
    cst.Comma,
    cst.Colon,
    cst.Semicolon,
    cst.AssignEqual,
    cst.LeftParen,
    cst.RightParen,
    cst.LeftSquareBracket,
    cst.RightSquareBracket,
    cst.LeftCurlyBrace,
    cst.RightCurlyBrace,
)


def _kind(value_type: type) -> int:
    kind = _KINDS[value_type] = (
        0
        if issubclass(value_type, _TRIVIA)
        else 1
        if issubclass(value_type, cst.CSTNode)
        else 2
        if issubclass(value_type, (list, tuple))
        else 0
    )
    return kind


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """A node's direct children in source order, without rebuilding it."""
    return _children(node)


def _children(node: cst.CSTNode) -> list[cst.CSTNode]:
    node_type = type(node)
    names = _FIELD_NAMES.get(node_type)
    if names is None:
        names = _FIELD_NAMES[node_type] = tuple(f.name for f in dataclasses.fields(node))
    fields: dict[str, Sequence[cst.CSTNode]] = {}
    kinds = _KINDS
    for name in names:
        value = getattr(node, name)
        kind = kinds.get(type(value))
        if kind is None:
            kind = _kind(type(value))
        if kind == 1:
            fields[name] = (value,)
        elif kind == 2 and value:
            items = [v for v in value if (kinds.get(type(v)) or _kind(type(v))) == 1]
            if items:
                fields[name] = items
    if len(fields) <= 1:
        return [child for items in fields.values() for child in items]
    key = (node_type, *fields)
    order = _FIELD_ORDER.get(key)
    if order is None:
        recorder = _ChildOrder(node)
        node.visit(recorder)
        first = {name: recorder.seen.get(id(items[0]), len(recorder.seen)) for name, items in fields.items()}
        order = _FIELD_ORDER[key] = tuple(sorted(first, key=first.__getitem__))
    return [child for name in order for child in fields[name]]


def _walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Pre-order walk over a CST in source order, without rebuilding it."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(_children(current)))


def paths_to(node: cst.CSTNode, hits: list[cst.CSTNode]) -> set[int]:
    """ids of the nodes under ``node`` (itself included) that are ``hits`` or
    contain one. A transformer that visits only these (``on_visit`` returns
    False elsewhere) gives the same result as a full visit when only hits (or
    their ancestors) can change: every other subtree is left as it is."""
    targets = {id(h) for h in hits}
    keep: set[int] = set()
    if not targets:
        return keep
    # The walk in pre-order (remembered by find_all) says where the last
    # target is: the search stops there.
    nodes = _index(node)[0]
    last = len(nodes) - 1
    while last >= 0 and id(nodes[last]) not in targets:
        last -= 1
    path: list[cst.CSTNode] = []  # the current node's ancestors, then itself
    stack = [(node, 0)]
    for _ in range(last + 1):  # the same pre-order as that walk
        current, depth = stack.pop()
        del path[depth:]
        path.append(current)
        if id(current) in targets:
            keep.update(map(id, path))
        stack.extend([(child, depth + 1) for child in reversed(_children(current))])
    return keep
