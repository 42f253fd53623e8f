from __future__ import annotations

import aivitals.protect as protect


def test_all_is_deliberate_and_exported() -> None:
    names = list(protect.__all__)
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(protect, name), name
    public = {n for n in dir(protect) if not n.startswith("_") and n[0].isupper()}
    assert public <= set(names), public - set(names)


def test_protect_imports_only_public_names_of_other_packages() -> None:
    # Layers point one way: protect may use instrument's public API, never a
    # private module of another aivitals package (aivitals.instrument._context).
    import ast
    from pathlib import Path

    offenders = []
    for source in sorted(Path(protect.__file__).parent.glob("*.py")):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
                if node.level:  # relative: ".x" stays inside protect, "..x._y" leaves it
                    names = [("." * node.level) + (node.module or "")]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                parts = name.lstrip(".").split(".")
                outside = name.startswith(("aivitals.", ".."))
                inside_protect = name.startswith("aivitals.protect")
                if outside and not inside_protect and any(p.startswith("_") for p in parts):
                    offenders.append(f"{source.name}: {name}")
    assert offenders == []
