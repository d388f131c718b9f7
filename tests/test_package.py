"""The package: ``import mha_lit`` loads NumPy only, plots and symbolic load on use.

Each check that is about what an import loads runs in a fresh interpreter, since this
one has imported matplotlib and SymPy long before (other tests, conftest).
"""

import ast
import inspect
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import mha_lit

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("matplotlib", "sympy")
LAZY = ("plots", "symbolic")


def _fresh(code: str) -> str:
    """Run code in a new interpreter at the repository root; return its stdout."""
    env = dict(os.environ, MPLBACKEND="Agg")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _loaded_heavy(after: str) -> list[str]:
    """Which of matplotlib, SymPy are in sys.modules after running ``after``."""
    out = _fresh(f"import sys\n{after}\n"
                 f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    return ast.literal_eval(out)


def test_import_mha_lit_loads_neither_matplotlib_nor_sympy():
    assert _loaded_heavy("import mha_lit") == []


def _eager_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(mha_lit.__path__)
                  if m.name not in LAZY)


@pytest.mark.parametrize("name", _eager_modules())
def test_no_other_module_imports_matplotlib_or_sympy(name):
    assert _loaded_heavy(f"import mha_lit.{name}") == []


def test_plots_and_symbolic_load_on_first_access_and_work():
    out = _fresh(
        "import sys\n"
        "import mha_lit\n"
        "assert 'mha_lit.plots' not in sys.modules\n"
        "fig = mha_lit.plots.product_shapes(3, 5, 7, entry=(2, 3))\n"
        "print(type(fig).__name__, len(fig.axes[0].patches))\n"
        "print('matplotlib' in sys.modules, 'sympy' in sys.modules)\n"
        "A = mha_lit.symbolic.matrix('a', 3, 5)\n"
        "print(A.shape, 'sympy' in sys.modules)\n"
        "from mha_lit import symbolic\n"
        "from mha_lit.plots import roofline\n"
        "print(symbolic is mha_lit.symbolic, roofline is mha_lit.plots.part2.roofline)\n")
    assert out.split("\n")[:4] == [
        "Figure 71",  # 3*5 + 5*7 + 3*7 cells
        "True False",  # plots brought matplotlib, not SymPy
        "(3, 5) True",
        "True True",
    ]


def test_lazy_modules_are_listed_and_unknown_names_still_fail():
    for name in LAZY + ("counting", "roofline", "rope"):
        assert name in mha_lit.__all__ and name in dir(mha_lit)
    with pytest.raises(AttributeError, match="no attribute 'plot'"):
        mha_lit.plot  # noqa: B018


# --- plots: one module per part, every figure importable from mha_lit.plots --------------

PARTS = {"part1": range(1, 9), "part2": range(9, 14), "part3": range(14, 19),
         "part4": range(19, 22), "part5": range(22, 25)}


@pytest.mark.parametrize("part", sorted(PARTS))
def test_every_figure_of_a_part_is_reexported_and_names_its_chapter(part):
    from mha_lit import plots

    module = getattr(plots, part)
    defined = [(name, obj) for name, obj in vars(module).items()
               if not name.startswith("_") and inspect.isfunction(obj)
               and obj.__module__ == module.__name__]
    if part not in ("part3", "part4", "part5"):  # filled chapter by chapter
        assert defined
    for name, obj in defined:
        assert getattr(plots, name) is obj, f"plots.{name} is not {part}.{name}"
        assert name in plots.__all__
        chapters = [int(c) for c in re.findall(r"chapters? (\d+)", obj.__doc__)]
        assert chapters, f"{part}.{name}'s docstring names no chapter"
        assert all(c in PARTS[part] for c in chapters), (name, chapters)
