"""Hyperparameters of a training script printed at the top of its log (modded-nanogpt).

modded-nanogpt logs start with the code of the script that ran, then a line of
``=`` characters. The values that training used are the ones the script binds
at its top level and passes to its optimizers, not the first ``lr=`` or
``weight_decay=`` that a regular expression meets (a function signature's
default, or the embedding Adam's value). So the code is parsed with ``ast``
(never executed) and read like this:

* **assignments** at the top level of the script: module statements and the
  bodies of top-level ``for``/``while``/``if``/``with``/``try`` blocks and
  top-level functions (module statements first), ``name = v`` and
  ``name: T = v``; and the literal fields of top-level classes
  (``class Hyperparameters: lr: float = 0.02``), reached through an instance
  (``args = Hyperparameters()``, then ``args.lr``). A value is a number,
  string or bool literal, or arithmetic of them and of names already bound
  (``1/320``, ``8 * 64 * 1024``); anything else is not a value.
* **optimizer constructor calls** (a callee named like an optimizer: Adam,
  AdamW, Muon, SGD, Lion, SOAP, Shampoo, ... or ``*Optimizer``) with the name
  each binds (``optimizer2 = Muon(...)``): one parameter group per entry of a
  list of ``dict(params=..., lr=...)`` (or a name bound to one), else one
  group; a group's lr and weight decay are its own keys, else the call's
  keywords. A weight decay the call does not pass is the class's default
  (below); 0 for an optimizer class the script defines whose ``__init__``
  takes no weight decay at all (it applies none); else None.

``weight_decay`` and ``lr`` are those of the group that trains the
attention/MLP matrices: the group whose parameters are named like them
(``hidden_matrix_params``, ``blocks``, ``attn``, ``mlp``, ``ndim == 2``, ...;
not ``ndim < 2``, ``bias``, ``norm``, ``embed``, ``head``, ...), else the
group of a Muon-type optimizer (Muon trains the matrices), else the only
group. Every group is kept in ``optimizer_groups``.

A weight decay the optimizer call does not pass is its class's default: the
``weight_decay`` default of the ``__init__`` of a class the script defines
(``class Muon: def __init__(self, params, lr=0.02, weight_decay=0.01)``), or
PyTorch's documented default of a ``torch.optim`` class; the group's
``weight_decay_from`` (and the header's) says so.

A line that is a syntax error to this Python (a 3.12 f-string) is read as
``pass`` (``parse_code``); a header that still does not parse is cut at its
first syntax error (the code that parses is read); one that does not parse at
all gives only top-level ``name = number`` lines (no indentation: never a
signature default).
"""
from __future__ import annotations

import ast
import math
import re

#: Callee names that construct an optimizer.
_OPTIMIZER = re.compile(r"(adam|muon|sgd|lion|soap|shampoo|sophia|adafactor|lamb|lars|rmsprop|optimizer)",
                        re.IGNORECASE)
#: Parameter-group names that mean the attention/MLP matrices.
_MATRIX_HINTS = ("hidden_matrix", "matrix", "matrices", "block", ".h.", "transformer.h", "layers", "attn",
                 "mlp", "ndim == 2", "ndim >= 2", "ndim==2", "ndim>=2", "2d")
#: ... unless they are named like vectors, embeddings or the head.
_NOT_MATRIX_HINTS = ("ndim < 2", "ndim<2", "ndim == 1", "ndim==1", "ndim <= 1", "bias", "norm", "scalar",
                     "gain", "embed", "wte", "lm_head", "head")
_WD_KEYS = ("weight_decay", "wd")
_SEPARATOR = re.compile(r"^={20,}\s*$", re.MULTILINE)
#: Script names read into the run's metadata besides lr and weight decay.
_META_NAMES = {"seed": ("seed",), "num_iterations": ("num_iterations", "train_steps", "num_steps"),
               "n_kv_heads": ("n_kv_heads", "num_kv_heads", "n_kv_head"),
               "variant": ("variant", "attention_variant")}
_KEEP_NAME = re.compile(r"(lr|learning_rate|weight_decay|wd|momentum|beta|seed|steps|iterations|warmup|"
                        r"cooldown|batch_size|seq_len)", re.IGNORECASE)
_MAX_POW = 64


_CODE_START = re.compile(r"^(?:import \w|from [\w.]+ import |\"\"\"|\'\'\'|#!)", re.MULTILINE)


def code_of(header: str) -> str:
    """The script part of a log header: from its first line of code (an import,
    a docstring, a shebang) to the first line of 20+ ``=`` after it (the lines
    before are the previous run's last output)."""
    m = _CODE_START.search(header)
    header = header[m.start():] if m else header
    m = _SEPARATOR.search(header)
    return header[:m.start()] if m else header


#: Lines of a header that may be blanked to parse it (see ``parse_code``).
_BLANKED_LINES_MAX = 20


def parse_code(code: str) -> ast.Module | None:
    """The module, with each line that is a syntax error to this Python
    replaced by ``pass`` at its indentation (an f-string that nests quotes
    parses only from Python 3.12; a script logged by a newer Python is not
    cut there), up to ``_BLANKED_LINES_MAX`` lines; past that, or when
    blanking does not help, cut before the first error (a few tries)."""
    lines = code.split("\n")
    for _ in range(_BLANKED_LINES_MAX):
        try:
            return ast.parse("\n".join(lines))
        except SyntaxError as exc:
            n = exc.lineno
            if not n or n > len(lines) or lines[n - 1].strip() in ("", "pass"):
                break
            line = lines[n - 1]
            lines[n - 1] = line[:len(line) - len(line.lstrip())] + "pass"
        except (ValueError, RecursionError, MemoryError):
            return None
    for _ in range(4):
        try:
            return ast.parse(code)
        except SyntaxError as exc:
            if not exc.lineno or exc.lineno <= 1:
                return None
            code = "\n".join(code.split("\n")[:exc.lineno - 1])
        except (ValueError, RecursionError, MemoryError):
            return None
    return None


class _Scope:
    """Names bound at the script's top level, class fields, instances."""

    def __init__(self) -> None:
        self.values: dict[str, object] = {}        # name -> literal value
        self.nodes: dict[str, ast.expr] = {}       # name -> the expression bound (for lists of groups)
        self.fields: dict[str, dict[str, object]] = {}   # class -> field -> value
        self.instances: dict[str, str] = {}        # variable -> class
        self.classes: dict[str, ast.ClassDef] = {}

    def value(self, node: ast.expr | None):
        """The literal value of ``node``, or None."""
        if node is None:
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str, bool)):
            return node.value
        if isinstance(node, ast.Name):
            return self.values.get(node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            cls = self.instances.get(node.value.id, node.value.id)
            return self.fields.get(cls, {}).get(node.attr)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = self.value(node.operand)
            return (-v if isinstance(node.op, ast.USub) else v) if _is_number(v) else None
        if isinstance(node, ast.BinOp):
            a, b = self.value(node.left), self.value(node.right)
            if not (_is_number(a) and _is_number(b)):
                return None
            try:
                if isinstance(node.op, ast.Add):
                    return a + b
                if isinstance(node.op, ast.Sub):
                    return a - b
                if isinstance(node.op, ast.Mult):
                    return a * b
                if isinstance(node.op, ast.Div):
                    return a / b
                if isinstance(node.op, ast.FloorDiv):
                    return a // b
                if isinstance(node.op, ast.Pow) and abs(b) <= _MAX_POW and abs(a) <= 1e6:
                    return a ** b
            except (ZeroDivisionError, OverflowError, ValueError):
                return None
        return None

    def bind(self, target: ast.expr, value: ast.expr, *, first_wins: bool) -> None:
        if isinstance(target, ast.Name):
            if first_wins and target.id in self.nodes:
                return
            self.nodes[target.id] = value
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in self.classes:
                self.instances[target.id] = value.func.id
            v = self.value(value)
            if v is not None:
                self.values[target.id] = v
            else:
                self.values.pop(target.id, None)
        elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
                and len(target.elts) == len(value.elts):
            for t, v in zip(target.elts, value.elts):
                self.bind(t, v, first_wins=first_wins)


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _top_statements(body: list[ast.stmt]):
    """Statements at the top level, through compound blocks (not defs or classes)."""
    for node in body:
        yield node
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith)):
            yield from _top_statements(node.body)
            yield from _top_statements(getattr(node, "orelse", []))
        elif isinstance(node, ast.Try):
            for part in (node.body, node.orelse, node.finalbody, *[h.body for h in node.handlers]):
                yield from _top_statements(part)


def _scope_of(tree: ast.Module) -> tuple[_Scope, list[tuple[ast.stmt, frozenset]]]:
    """The script's bindings, and the statements searched for optimizer calls,
    each with the parameter names of the top-level function it is in (none at
    module level): a call that passes those is a helper's, not what ran."""
    scope = _Scope()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            scope.classes[node.name] = node
            fields = {}
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and st.value is not None:
                    v = scope.value(st.value)
                elif isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                    v = scope.value(st.value)
                else:
                    continue
                if v is not None:
                    fields[(st.target if isinstance(st, ast.AnnAssign) else st.targets[0]).id] = v
            scope.fields[node.name] = fields
    module = [(st, frozenset()) for st in _top_statements(tree.body)]
    functions = [(st, frozenset(a.arg for a in f.args.args + f.args.kwonlyargs + f.args.posonlyargs))
                 for f in tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for st in _top_statements(f.body)]
    for stmts, first_wins in ((module, False), (functions, True)):
        for st, _ in stmts:
            if isinstance(st, ast.Assign):
                for t in st.targets:
                    scope.bind(t, st.value, first_wins=first_wins)
            elif isinstance(st, ast.AnnAssign) and st.value is not None:
                scope.bind(st.target, st.value, first_wins=first_wins)
    return scope, module + functions


def _callee(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _init_weight_decay(scope: _Scope, cls: ast.ClassDef) -> tuple[bool, object]:
    """(whether the class's ``__init__`` is found, the weight decay a call that
    passes none gets): its ``weight_decay``/``wd`` parameter's default (None
    without one, or when it is no literal), 0.0 when it takes no weight decay
    at all (no such parameter, no ``**kwargs``)."""
    for st in cls.body:
        if isinstance(st, ast.FunctionDef) and st.name == "__init__":
            a = st.args
            positional = a.posonlyargs + a.args
            defaults = dict(zip((x.arg for x in positional[len(positional) - len(a.defaults):]), a.defaults))
            defaults.update((x.arg, d) for x, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None)
            names = [x.arg for x in positional + a.kwonlyargs]
            for n in names:
                if n in _WD_KEYS:
                    return True, scope.value(defaults.get(n))
            if any("decay" in n for n in names) or a.kwarg is not None:
                return True, None
            return True, 0.0
    return False, None          # inherited __init__: unknown


#: PyTorch's documented ``weight_decay`` defaults (torch.optim), for a call
#: that passes none to an optimizer the script does not define itself.
TORCH_WEIGHT_DECAY_DEFAULTS = {"Adam": 0.0, "AdamW": 1e-2, "SGD": 0.0, "RMSprop": 0.0, "Adagrad": 0.0,
                               "Adamax": 0.0, "NAdam": 0.0, "RAdam": 0.0}


def _call_default_wd(scope: _Scope, call: ast.Call, name: str) -> tuple[object, str | None]:
    """(weight decay, where it comes from) of an optimizer call that passes none:
    the default of the script's own class (``class Muon: def __init__(self,
    params, lr=0.02, weight_decay=0.01)``), else PyTorch's documented default
    for a ``torch.optim`` class (``TORCH_WEIGHT_DECAY_DEFAULTS``)."""
    if name in scope.classes:
        found, wd = _init_weight_decay(scope, scope.classes[name])
        if found and _is_number(wd):
            return wd, f"default of {name}.__init__ in the logged code"
        return None, None
    torch_call = isinstance(call.func, ast.Attribute) and "optim" in ast.unparse(call.func.value)
    if (torch_call or isinstance(call.func, ast.Name)) and name in TORCH_WEIGHT_DECAY_DEFAULTS:
        return TORCH_WEIGHT_DECAY_DEFAULTS[name], f"torch.optim.{name}'s default"
    return None, None


def _groups(scope: _Scope, call: ast.Call, bound: str | None) -> list[dict]:
    name = _callee(call) or "?"
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    params = call.args[0] if call.args else kw.get("params")
    if isinstance(params, ast.Name) and isinstance(scope.nodes.get(params.id), (ast.List, ast.Tuple)):
        params = scope.nodes[params.id]
    default_wd = next((scope.value(kw[k]) for k in _WD_KEYS if k in kw), None)
    wd_from = None
    if default_wd is None and not any(k in kw for k in _WD_KEYS):
        default_wd, wd_from = _call_default_wd(scope, call, name)
    default_lr = scope.value(kw.get("lr"))
    entries = []
    if isinstance(params, (ast.List, ast.Tuple)) and params.elts and all(_group_dict(e) is not None
                                                                         for e in params.elts):
        entries = [_group_dict(e) for e in params.elts]
    else:
        entries = [{"params": params}]
    out = []
    for g in entries:
        own = any(k in g for k in _WD_KEYS)
        wd = next((scope.value(g[k]) for k in _WD_KEYS if k in g), default_wd)
        lr = scope.value(g["lr"]) if "lr" in g else default_lr
        p = g.get("params")
        group = {"optimizer": name, "bound_to": bound,
                 "params": (ast.unparse(p)[:120] if p is not None else None),
                 "lr": lr if _is_number(lr) else None,
                 "weight_decay": wd if _is_number(wd) else None}
        if wd_from and not own and group["weight_decay"] is not None:
            group["weight_decay_from"] = wd_from
        out.append(group)
    return out


def _group_dict(node: ast.expr) -> dict | None:
    """The keys of a ``dict(params=..., lr=...)`` or ``{"params": ..., ...}`` group."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        d = {k.arg: k.value for k in node.keywords if k.arg}
    elif isinstance(node, ast.Dict):
        d = {k.value: v for k, v in zip(node.keys, node.values)
             if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    else:
        return None
    return d if "params" in d else None


def optimizer_groups(scope: _Scope, statements: list[tuple[ast.stmt, frozenset]]) -> list[dict]:
    """Every optimizer constructor call's parameter groups, in script order."""
    out, seen = [], set()
    compound = (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith, ast.Try,
                ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    for st, own_params in statements:
        if isinstance(st, compound):
            continue                  # their bodies are among ``statements``; classes never
        bound = None
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
            bound = st.targets[0].id
        for node in ast.walk(st):
            if not isinstance(node, ast.Call) or id(node) in seen:
                continue
            seen.add(id(node))
            name = _callee(node)
            if not name or not _OPTIMIZER.search(name) or name in ("zero_grad", "step"):
                continue
            kw = {k.arg for k in node.keywords}
            first = node.args[0] if node.args else None
            groups_list = isinstance(first, ast.List) or (
                isinstance(first, ast.Name) and isinstance(scope.nodes.get(first.id), (ast.List, ast.Tuple)))
            if not (kw & {"lr", *_WD_KEYS, "params"}) and not groups_list:
                continue
            used = {n.id for part in [*node.args, *(k.value for k in node.keywords)]
                    for n in ast.walk(part) if isinstance(n, ast.Name)}
            if used & own_params:
                continue              # a helper passing on its own arguments
            out.extend(_groups(scope, node, bound if node is getattr(st, "value", None) else None))
    return out


def matrix_group(groups: list[dict]) -> dict | None:
    """The group that trains the attention/MLP matrices (see the module docstring)."""
    for g in groups:
        text = (g["params"] or "").lower()
        if any(h in text for h in _MATRIX_HINTS) and not any(h in text for h in _NOT_MATRIX_HINTS):
            return g
    muon = [g for g in groups if "muon" in g["optimizer"].lower()]
    if muon:
        return muon[0]
    return groups[0] if len(groups) == 1 else None


_FLAT_ASSIGN = re.compile(r"^([A-Za-z_]\w*)\s*(?::\s*[\w\[\], |]+)?=\s*([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+))"
                          r"\s*(?:#.*)?$", re.MULTILINE)


def header_hyperparameters(header: str) -> dict:
    """Hyperparameters the script in a log header used (see the module docstring).

    Keys: ``lr``, ``weight_decay`` (of the matrix group), ``weight_decay_applies_to``
    (which group), ``optimizer_groups``, ``seed``, ``num_iterations``, ``n_kv_heads``,
    ``variant`` and ``code_assignments`` (top-level names like lr/wd/steps), each
    when the script states it.
    """
    out: dict = {}
    code = code_of(header)
    tree = parse_code(code)
    if tree is not None:
        try:
            _from_tree(tree, out)
        except (RecursionError, MemoryError):      # e.g. 1+1+...+1 nested past the stack
            out.clear()
    # What the parsed part does not say, from unindented ``name = number`` lines
    # (the part after a syntax error, or a header that does not parse at all).
    flat = {k: float(v) for k, v in _FLAT_ASSIGN.findall(code)}
    for key, names in (("lr", ("lr", "learning_rate")), ("weight_decay", ("weight_decay",)),
                       *_META_NAMES.items()):
        for n in names:
            if n in flat and key != "variant" and key not in out:
                out[key] = int(flat[n]) if key in ("seed", "num_iterations", "n_kv_heads") else flat[n]
                break
    return out


def _from_tree(tree: ast.Module, out: dict) -> None:
    scope, statements = _scope_of(tree)
    groups = optimizer_groups(scope, statements)
    if groups:
        out["optimizer_groups"] = groups
        g = matrix_group(groups)
        if g is not None:
            if g["lr"] is not None:
                out["lr"] = float(g["lr"])
            if g["weight_decay"] is not None:
                out["weight_decay"] = float(g["weight_decay"])
                if g.get("weight_decay_from"):
                    out["weight_decay_from"] = g["weight_decay_from"]
            out["weight_decay_applies_to"] = f"{g['optimizer']}({g['params']})"
    values = dict(scope.values)
    for cls in scope.fields.values():
        for k, v in cls.items():
            values.setdefault(k, v)
    for key, names in _META_NAMES.items():
        for n in names:
            v = values.get(n)
            if key == "variant" and isinstance(v, str):
                out[key] = v
                break
            if key != "variant" and _is_number(v) and float(v) == int(v):
                out[key] = int(v)
                break
    kept = {k: v for k, v in values.items() if _KEEP_NAME.search(k) and (_is_number(v) or isinstance(v, bool))}
    if kept:
        out["code_assignments"] = dict(sorted(kept.items())[:200])
