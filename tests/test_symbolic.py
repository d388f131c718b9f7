import numpy as np
import pytest
import sympy as sp

from mha_lit import Dims, symbolic
from tests.shapes_for_tests import PRIME_DIMS


@pytest.mark.parametrize("dims", PRIME_DIMS[:4], ids=str)
def test_qk_transpose_shape_and_entries(dims):
    M = symbolic.qk_transpose(dims)
    assert M.shape == (dims.tokens, dims.tokens)
    for i in range(dims.tokens):
        for j in range(dims.tokens):
            terms = sp.Add.make_args(sp.expand(M[i, j]))
            assert len(terms) == dims.d_k
            expected = sum(sp.Symbol(f"q_{{{i+1},{a+1}}}") * sp.Symbol(f"k_{{{j+1},{a+1}}}")
                           for a in range(dims.d_k))
            assert sp.expand(M[i, j] - expected) == 0


def test_qk_transpose_agrees_with_numpy():
    dims = Dims()
    M = symbolic.qk_transpose(dims)
    rng = np.random.default_rng(0)
    Q, K = rng.standard_normal((3, 7)), rng.standard_normal((3, 7))
    subs = {sp.Symbol(f"q_{{{i+1},{a+1}}}"): Q[i, a] for i in range(3) for a in range(7)}
    subs |= {sp.Symbol(f"k_{{{i+1},{a+1}}}"): K[i, a] for i in range(3) for a in range(7)}
    assert np.allclose(np.array(M.subs(subs), dtype=float), Q @ K.T)


def test_matrix_refuses_empty():
    with pytest.raises(ValueError, match="0 x 3"):
        symbolic.matrix("a", 0, 3)
