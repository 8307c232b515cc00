"""Issue 32: help() says how to use every public class, function and
method of the ckpt package (no leading underscore; dunder methods but the
user-facing constructors are covered by their class's docstring)."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.join(ROOT, "client", "python", "ckpt")
# Constructors whose arguments users pass: their own docstring says them.
CONSTRUCTORS = {("torch.py", "Checkpointer"), ("lightning.py", "CkptdCheckpointIO"), ("hf.py", "CkptdCallback"),
                ("client.py", "Client"), ("jax.py", "Checkpointer"), ("orbax.py", "Handler")}


def missing():
    out = []
    for fn in sorted(os.listdir(PKG)):
        if not fn.endswith(".py"):
            continue
        with open(os.path.join(PKG, fn)) as f:
            tree = ast.parse(f.read())
        if ast.get_docstring(tree) is None:
            out.append(f"{fn}: module")

        def visit(node, cls):
            for n in ast.iter_child_nodes(node):
                if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    continue
                ctor = cls is not None and n.name == "__init__" and (fn, cls) in CONSTRUCTORS
                if (not n.name.startswith("_") or ctor) and ast.get_docstring(n) is None:
                    out.append(f"{fn}:{n.lineno}: {cls + '.' if cls else ''}{n.name}")
                if isinstance(n, ast.ClassDef) and not n.name.startswith("_"):
                    visit(n, n.name)
        visit(tree, None)
    return out


def test_every_public_name_has_a_docstring():
    assert missing() == []
