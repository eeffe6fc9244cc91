"""python/inferd/_core.pyi, the hand-written stub of the C++ module inferd._core, against the module
itself, both ways: every class, function, method, property and attribute the stub declares exists
in the module as the same kind of thing (a read-only property is no writable attribute, a static
method no method), every public name the module and its classes expose is in the stub, and each
function's parameters (names, kinds, defaults; `self` aside) and whether it returns None agree with
the signature pybind11 writes as the first line of its __doc__. Parameter and return types are not
compared: pybind11 names them its own way (typing.SupportsInt, collections.abc.Sequence[str]).

The module is the truth: on a mismatch, fix the stub (or the binding, if the binding is wrong).
`stub_problems(path)` runs every check on any stub file, e.g. a scratch copy."""

from __future__ import annotations

import ast
import inspect
import re
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import inferd._core as _core

ROOT = Path(__file__).resolve().parents[2]
STUB = ROOT / "python" / "inferd" / "_core.pyi"

# What pybind11's enums carry besides their members; the stub may leave it out.
ENUM_MACHINERY = frozenset({"name", "value"})


class _Marker:
    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


NO_DEFAULT = _Marker("<no default>")
# A default whose value cannot be read as a literal (`...` in the stub, an object's repr in
# pybind11's signature): only its presence is compared.
SOME_DEFAULT = _Marker("<some default>")


@dataclass(frozen=True)
class Param:
    name: str
    # "positional-only", "positional", "keyword-only", "*args" or "**kwargs"
    kind: str
    default: object = NO_DEFAULT


@dataclass(frozen=True)
class Signature:
    params: tuple[Param, ...]
    returns_none: bool


@dataclass
class Member:
    # module level: "class", "function", "attribute"; in a class: "method", "staticmethod",
    # "classmethod", "property" (read-only), "attribute" (readable and writable), "classvar",
    # "class"
    kind: str
    signatures: list[Signature] = field(default_factory=list)  # a stub's, one per overload
    members: dict[str, Member] = field(default_factory=dict)  # a class's


# --- the stub, read with ast -----------------------------------------------------------------


def _literal(node: ast.expr | None) -> object:
    if node is None:
        return NO_DEFAULT
    if isinstance(node, ast.Constant) and node.value is Ellipsis:
        return SOME_DEFAULT
    try:
        return ast.literal_eval(node)
    except ValueError:
        return SOME_DEFAULT


def _stub_signature(node: ast.FunctionDef) -> Signature:
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults))
    defaults += args.defaults
    params = [
        Param(
            arg.arg,
            "positional-only" if i < len(args.posonlyargs) else "positional",
            _literal(default),
        )
        for i, (arg, default) in enumerate(zip(positional, defaults, strict=True))
    ]
    if args.vararg:
        params.append(Param(args.vararg.arg, "*args"))
    params += [
        Param(arg.arg, "keyword-only", _literal(default))
        for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    ]
    if args.kwarg:
        params.append(Param(args.kwarg.arg, "**kwargs"))
    returns = node.returns
    returns_none = isinstance(returns, ast.Constant) and returns.value is None
    return Signature(tuple(params), returns_none)


def _decorator_names(node: ast.FunctionDef) -> list[str]:
    return [ast.unparse(d) for d in node.decorator_list]


def _is_classvar(annotation: ast.expr) -> bool:
    target = annotation.value if isinstance(annotation, ast.Subscript) else annotation
    return ast.unparse(target) in ("ClassVar", "typing.ClassVar")


def _stub_body(body: list[ast.stmt], in_class: bool) -> dict[str, Member]:
    members: dict[str, Member] = {}
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom | ast.Pass):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # a docstring or `...`
        if isinstance(node, ast.ClassDef):
            # A class has what its bases declared earlier in the stub declare, then its own.
            inherited: dict[str, Member] = {}
            for base in node.bases:
                if ast.unparse(base) in members:
                    inherited.update(members[ast.unparse(base)].members)
            own = _stub_body(node.body, True)
            members[node.name] = Member("class", members={**inherited, **own})
        elif isinstance(node, ast.FunctionDef):
            decorators = _decorator_names(node)
            if f"{node.name}.setter" in decorators:
                members[node.name].kind = "attribute"  # a property with a setter
                continue
            if f"{node.name}.deleter" in decorators:
                continue
            if "property" in decorators:
                members[node.name] = Member("property")
                continue
            if not in_class:
                kind = "function"
            elif "staticmethod" in decorators:
                kind = "staticmethod"
            elif "classmethod" in decorators:
                kind = "classmethod"
            else:
                kind = "method"
            member = members.setdefault(node.name, Member(kind))
            member.signatures.append(_stub_signature(node))  # one per @overload
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
            if not in_class and _is_stub_only(name):
                continue
            classvar = in_class and _is_classvar(node.annotation)
            members[name] = Member("classvar" if classvar else "attribute")
        elif isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            for target in node.targets:
                assert isinstance(target, ast.Name)
                if not in_class and _is_stub_only(target.id):
                    continue  # a private type alias
                members[target.id] = Member("classvar" if in_class else "attribute")
        else:
            raise AssertionError(
                f"line {node.lineno} of the stub: this test cannot read a "
                f"{type(node).__name__} statement; teach it"
            )
    return members


def _is_stub_only(name: str) -> bool:
    """A module-level `_Name = ...` is the stub's own type alias, not a name of the module."""
    return name.startswith("_") and not name.startswith("__")


def parse_stub(path: Path) -> dict[str, Member]:
    """What the stub at `path` declares, by name (a class's members under its own)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return _stub_body(tree.body, False)


# --- the module, read by introspection ------------------------------------------------------


def _is_enum(cls: type) -> bool:
    return isinstance(getattr(cls, "__members__", None), dict)


def runtime_member(owner: object, name: str) -> Member | None:
    """What `owner` (the module or one of its classes) has under `name`, or None."""
    try:
        raw = inspect.getattr_static(owner, name)
    except AttributeError:
        return None
    if isinstance(owner, types.ModuleType):
        if isinstance(raw, type):
            return Member("class", members=runtime_class_members(raw))
        return Member("function" if callable(raw) else "attribute")
    if name == "__init__" and isinstance(raw, types.WrapperDescriptorType):
        return None  # object's: pybind11 bound no constructor, and the type cannot be made
    if isinstance(raw, staticmethod):
        return Member("staticmethod")
    if isinstance(raw, classmethod):
        return Member("classmethod")
    if isinstance(raw, type):
        return Member("class", members=runtime_class_members(raw))
    if type(raw).__name__ == "pybind11_static_property":
        return Member("classvar")  # read from the class (an enum's __members__)
    if isinstance(raw, property):
        return Member("property" if raw.fset is None else "attribute")
    if callable(raw):
        return Member("method")
    return Member("classvar")  # an enum's member, a constant


def _public(name: str) -> bool:
    return not name.startswith("_") or name == "__init__"


def runtime_class_members(cls: type) -> dict[str, Member]:
    """The class's public names (and its constructor), pybind11's enum machinery aside."""
    names = [n for n in [*dir(cls), "__init__"] if _public(n)]
    if _is_enum(cls):
        names = [n for n in names if n not in ENUM_MACHINERY]
    members = {}
    for name in dict.fromkeys(names):
        member = runtime_member(cls, name)
        if member is not None:
            members[name] = member
    return members


def runtime_members() -> dict[str, Member]:
    """The module's public names."""
    members = {}
    for name in dir(_core):
        if _public(name):
            member = runtime_member(_core, name)
            assert member is not None
            members[name] = member
    return members


# --- pybind11's signatures -------------------------------------------------------------------


def _split_top_level(text: str, separator: str, maxsplit: int = -1) -> list[str]:
    """`text` split at each `separator` (the first `maxsplit` ones) outside brackets and string
    literals."""
    parts: list[str] = []
    depth, quote, start, i = 0, "", 0, 0
    while i < len(text) and len(parts) != maxsplit:
        char = text[i]
        if quote:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith(separator, i):
            parts.append(text[start:i])
            start = i + len(separator)
            i = start
            continue
        i += 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def parse_pybind_signature(line: str, name: str) -> Signature:
    """A signature as pybind11 writes it: `name(self: m.X, a: int, b: str = '') -> None`."""
    match = re.fullmatch(rf"{re.escape(name)}\((.*)\)\s*->\s*(.+)", line.strip())
    if match is None:
        raise ValueError(f"not a signature of {name}: {line!r}")
    params: list[Param] = []
    kind = "positional"
    text = match.group(1).strip()
    for part in _split_top_level(text, ",") if text else []:
        if part == "/":
            params = [Param(p.name, "positional-only", p.default) for p in params]
            continue
        if part == "*":
            kind = "keyword-only"
            continue
        head, *default = _split_top_level(part, "=", maxsplit=1)
        param_name = _split_top_level(head, ":")[0]
        if param_name.startswith("**"):
            params.append(Param(param_name[2:], "**kwargs"))
        elif param_name.startswith("*"):
            params.append(Param(param_name[1:], "*args"))
            kind = "keyword-only"
        else:
            value: object = NO_DEFAULT
            if default:
                try:
                    value = ast.literal_eval(default[0])
                except (ValueError, SyntaxError):
                    value = SOME_DEFAULT
            params.append(Param(param_name, kind, value))
    return Signature(tuple(params), match.group(2).strip() == "None")


def pybind_signatures(function: object, name: str) -> list[Signature]:
    """The signatures (one per overload) pybind11 wrote at the head of `function`'s __doc__; none
    when it wrote none."""
    lines = (getattr(function, "__doc__", None) or "").splitlines()
    if "Overloaded function." in lines[:2]:  # after `name(*args, **kwargs)`: `1. name(...)`, ...
        numbered = (re.match(r"\d+\. (.*)", line) for line in lines[2:])
        return [
            parse_pybind_signature(match.group(1), name)
            for match in numbered
            if match and match.group(1).startswith(f"{name}(")
        ]
    if lines and lines[0].startswith(f"{name}("):
        return [parse_pybind_signature(lines[0], name)]
    return []


# --- the checks ------------------------------------------------------------------------------


def _pairs(
    stub: dict[str, Member], owner: object, where: str = ""
) -> Iterator[tuple[str, Member, Member | None, object]]:
    """(qualified name, the stub's member, the module's member or None, its owner) for every
    name the stub declares, classes' members included."""
    for name, declared in stub.items():
        actual = runtime_member(owner, name)
        yield f"{where}{name}", declared, actual, owner
        if actual is not None and declared.kind == actual.kind == "class":
            yield from _pairs(declared.members, getattr(owner, name), f"{where}{name}.")


def missing_from_module(stub: dict[str, Member]) -> list[str]:
    """Names the stub declares that the module lacks, or has as another kind of thing."""
    problems = []
    for name, declared, actual, _owner in _pairs(stub, _core):
        if actual is None:
            problems.append(f"{name}: the stub declares {_a(declared.kind)}, the module has none")
        elif declared.kind != actual.kind:
            problems.append(
                f"{name}: {_a(declared.kind)} in the stub, {_a(actual.kind)} in the module"
            )
    return problems


def missing_from_stub(stub: dict[str, Member]) -> list[str]:
    """Public names of the module and its classes that the stub does not declare."""
    problems = []

    def walk(declared: dict[str, Member], actual: dict[str, Member], where: str) -> None:
        for name, member in actual.items():
            if name not in declared:
                problems.append(f"{where}{name}: {_a(member.kind)} of the module, not in the stub")
            elif member.kind == declared[name].kind == "class":
                walk(declared[name].members, member.members, f"{where}{name}.")

    walk(stub, runtime_members(), "")
    return problems


def _describe(signature: Signature) -> str:
    """The signature as Python writes one, types left out."""
    params = signature.params
    parts: list[str] = []
    starred = False
    for i, param in enumerate(params):
        if param.kind == "keyword-only" and not starred:
            parts.append("*")
        starred = starred or param.kind in ("*args", "keyword-only")
        prefix = {"*args": "*", "**kwargs": "**"}.get(param.kind, "")
        default = "" if param.default is NO_DEFAULT else f"={param.default!r}"
        parts.append(f"{prefix}{param.name}{default}")
        last_positional_only = i + 1 == len(params) or params[i + 1].kind != "positional-only"
        if param.kind == "positional-only" and last_positional_only:
            parts.append("/")
    return f"({', '.join(parts)}) -> {'None' if signature.returns_none else '...'}"


def _a(kind: str) -> str:
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}"


def _compare(name: str, declared: Signature, actual: Signature, method: bool) -> list[str]:
    stub_params, module_params = declared.params, actual.params
    if method:  # `self`, which pybind11 always names so; the stub may not
        stub_params, module_params = stub_params[1:], module_params[1:]
    problems = []
    stub_names = [p.name for p in stub_params]
    module_names = [p.name for p in module_params]
    if stub_names != module_names:
        problems.append(f"parameters {stub_names} in the stub, {module_names} in the module")
    else:
        for ours, theirs in zip(stub_params, module_params, strict=True):
            if ours.kind != theirs.kind:
                problems.append(
                    f"{ours.name} is {ours.kind} in the stub, {theirs.kind} in the module"
                )
            if (ours.default is NO_DEFAULT) != (theirs.default is NO_DEFAULT):
                has = "has" if ours.default is not NO_DEFAULT else "has no"
                problems.append(f"{ours.name} {has} default in the stub, unlike the module's")
            elif SOME_DEFAULT not in (ours.default, theirs.default) and (
                ours.default != theirs.default or type(ours.default) is not type(theirs.default)
            ):
                problems.append(
                    f"{ours.name} defaults to {ours.default!r} in the stub, "
                    f"to {theirs.default!r} in the module"
                )
    if declared.returns_none != actual.returns_none:
        problems.append(
            "returns None in the stub, a value in the module"
            if declared.returns_none
            else "returns a value in the stub, None in the module"
        )
    return [
        f"{name}: {p}  [stub {_describe(declared)}, module {_describe(actual)}]" for p in problems
    ]


def signature_mismatches(stub: dict[str, Member]) -> tuple[list[str], int]:
    """Where the stub's functions and methods disagree with pybind11's signatures, and how many
    signatures were compared."""
    problems = []
    compared = 0
    for name, declared, actual, owner in _pairs(stub, _core):
        callable_kinds = ("function", "method", "staticmethod", "classmethod")
        if actual is None or declared.kind != actual.kind or actual.kind not in callable_kinds:
            continue  # reported by missing_from_module, or no signature to compare
        short_name = name.rpartition(".")[2]
        signatures = pybind_signatures(getattr(owner, short_name), short_name)
        if not signatures:
            problems.append(f"{name}: pybind11 wrote no signature this test can read")
            continue
        if len(signatures) != len(declared.signatures):
            problems.append(
                f"{name}: {len(declared.signatures)} overload(s) in the stub, "
                f"{len(signatures)} in the module"
            )
            continue
        method = actual.kind in ("method", "classmethod")
        for ours, theirs in zip(declared.signatures, signatures, strict=True):
            problems += _compare(name, ours, theirs, method)
            compared += 1
    return problems, compared


def stub_problems(path: Path) -> list[str]:
    """Every disagreement between the stub at `path` and the module."""
    stub = parse_stub(path)
    return [*missing_from_module(stub), *missing_from_stub(stub), *signature_mismatches(stub)[0]]


# --- the tests -------------------------------------------------------------------------------


def test_everything_the_stub_declares_is_in_the_module() -> None:
    problems = missing_from_module(parse_stub(STUB))
    assert not problems, "\n".join(problems)


def test_everything_the_module_exposes_is_in_the_stub() -> None:
    problems = missing_from_stub(parse_stub(STUB))
    assert not problems, "\n".join(problems)


def test_the_stubs_signatures_are_the_modules() -> None:
    stub = parse_stub(STUB)
    problems, compared = signature_mismatches(stub)
    assert not problems, "\n".join(problems)
    assert compared > 0


def test_pybind_signatures_are_read_through_brackets_strings_and_markers() -> None:
    signature = parse_pybind_signature(
        "f(self: m.X, /, a: dict[str, tuple[int, int]] = {'k,=': (1, 2)}, b: str = ', ', *, "
        "c: m.Y = <m.Y object at 0x1>, **kwargs) -> None",
        "f",
    )
    assert signature == Signature(
        (
            Param("self", "positional-only"),
            Param("a", "positional", {"k,=": (1, 2)}),
            Param("b", "positional", ", "),
            Param("c", "keyword-only", SOME_DEFAULT),
            Param("kwargs", "**kwargs"),
        ),
        returns_none=True,
    )
    assert not parse_pybind_signature("g() -> list[int]", "g").returns_none


def test_pybind_overloads_are_read_one_by_one() -> None:
    doc = (
        "f(*args, **kwargs)\nOverloaded function.\n\n1. f(self: m.X, a: int) -> None\n\n"
        "Takes a number.\n\n2. f(self: m.X, a: str, b: bool = False) -> int\n"
    )
    signatures = pybind_signatures(types.SimpleNamespace(__doc__=doc), "f")
    assert [[p.name for p in s.params] for s in signatures] == [["self", "a"], ["self", "a", "b"]]
    assert [s.returns_none for s in signatures] == [True, False]
