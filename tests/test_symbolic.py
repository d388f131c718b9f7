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
    with pytest.raises(ValueError, match="the rows of matrix a must be a positive integer, got 0"):
        symbolic.matrix("a", 0, 3)
    with pytest.raises(TypeError, match="the columns of matrix a must be a positive integer"):
        symbolic.matrix("a", 2, 3.0)


# --- chapter 1 and 3 additions: product_entry, causal_mask, softmax ------------------------

@pytest.mark.parametrize("a,b,c", [(3, 5, 7), (2, 3, 5), (7, 11, 13), (1, 2, 3)])
def test_product_entry_is_row_times_column(a, b, c):
    A, C = symbolic.matrix("A", a, b), symbolic.matrix("C", b, c)
    R = A * C
    for x in range(1, a + 1):
        for y in range(1, c + 1):
            entry = symbolic.product_entry(A, C, x, y)
            assert len(sp.Add.make_args(entry)) == b
            assert sp.expand(entry - R[x - 1, y - 1]) == 0


def test_product_entry_refuses_wrong_shapes_and_indices():
    A, C = symbolic.matrix("A", 3, 5), symbolic.matrix("C", 7, 3)
    with pytest.raises(ValueError, match="5 columns to match C's 7 rows"):
        symbolic.product_entry(A, C, 1, 1)
    with pytest.raises(ValueError, match=r"entry \(4, 1\)"):
        symbolic.product_entry(A, symbolic.matrix("C", 5, 7), 4, 1)


def test_symbolic_causal_mask_and_softmax_match_numpy():
    from mha_lit import causal_mask, softmax

    for n in (1, 2, 3, 5):
        M = sp.Matrix(n, n, lambda i, j: sp.Integer(i * n + j + 1))
        masked = symbolic.causal_mask(M)
        assert all(masked[i, j] == -sp.oo for i in range(n) for j in range(n) if j > i)
        assert all(masked[i, j] == M[i, j] for i in range(n) for j in range(n) if j <= i)
        S = symbolic.softmax(masked)
        assert all(sp.simplify(sum(S.row(i)) - 1) == 0 for i in range(n))
        assert all(S[i, j] == 0 for i in range(n) for j in range(n) if j > i)
        numeric = np.array(S.evalf(30), dtype=float)
        assert np.allclose(numeric, softmax(causal_mask(np.array(M, dtype=float))), atol=1e-15)


def test_symbolic_softmax_keeps_exponentials_and_refuses_all_masked_rows():
    S = symbolic.softmax(sp.Matrix([[4, 5]]))
    assert S[0, 0] == sp.exp(4) / (sp.exp(4) + sp.exp(5))
    with pytest.raises(ValueError, match="row 2"):
        symbolic.softmax(sp.Matrix([[1, 2], [-sp.oo, -sp.oo]]))


# --- Part I, chapter 6: how outputs depend on inputs -------------------------------------


@pytest.mark.parametrize("dims", [Dims(), Dims(tokens=2, d_model=3, d_k=5, d_v=7, heads=1),
                                  Dims(tokens=4, d_model=2, d_k=3, d_v=5, heads=3)], ids=str)
def test_output_rows_agrees_with_numpy_and_depends_only_on_earlier_rows(dims):
    from mha_lit import init_weights, multi_head_attention

    Y, X, W = symbolic.output_rows(dims)
    assert Y.shape == X.shape == (dims.tokens, dims.d_model)
    assert len(W) == 3 * dims.heads + 1 and W[-1].shape == (dims.concat, dims.d_model)
    D = symbolic.depends_on(Y, X)
    assert D == [[j <= i for j in range(dims.tokens)] for i in range(dims.tokens)]
    # the exact expression evaluates to the library's output
    Wn = init_weights(dims, seed=3)
    Xn = np.random.default_rng(3).standard_normal((dims.tokens, dims.d_model))
    numeric = []
    for i in range(dims.heads):
        numeric += [sp.Matrix(Wn.W_Q[i]), sp.Matrix(Wn.W_K[i]), sp.Matrix(Wn.W_V[i])]
    exact = symbolic.multi_head_output(sp.Matrix(Xn), (*numeric, sp.Matrix(Wn.W_O)))
    assert np.allclose(np.array(exact.evalf(), dtype=float), multi_head_attention(Xn, Wn),
                       atol=1e-10)


def test_first_output_row_has_zero_derivative_in_later_rows():
    dims = Dims(tokens=3, d_model=2, d_k=3, d_v=2, heads=1)
    Y, X, _ = symbolic.output_rows(dims)
    assert all(sp.diff(y, x) == 0 for y in Y.row(0) for x in X[1:, :])
    assert any(sp.diff(y, x) != 0 for y in Y.row(0) for x in X.row(0))
    assert all(sp.diff(y, x) == 0 for y in Y.row(1) for x in X.row(2))


def test_depends_on_is_not_fooled_and_refuses_mismatched_rows():
    X = symbolic.matrix("x", 2, 2)
    Y = sp.Matrix([[X[1, 0], 1], [0, X[0, 1]]])  # row 1 uses X_2, row 2 uses X_1
    assert symbolic.depends_on(Y, X) == [[False, True], [True, False]]
    with pytest.raises(ValueError, match="Y has 1 rows but X has 2"):
        symbolic.depends_on(Y[:1, :], X)


def test_weight_matrices_shapes_and_order():
    W = symbolic.weight_matrices(Dims())
    assert [w.shape for w in W] == [(5, 7), (5, 7), (5, 11)] * 2 + [(22, 5)]
    assert str(W[3][0, 0]) == "W^{Q2}_{1,1}"
    with pytest.raises(ValueError, match="X must have 5 columns"):
        symbolic.multi_head_output(symbolic.matrix("x", 3, 4), W)


# --- chapter 8: bias symbols, opt-in ----------------------------------------------------------

def test_bias_vectors_shapes_names_and_order():
    b = symbolic.bias_vectors(Dims())
    assert [v.shape for v in b] == [(1, 7), (1, 7), (1, 11)] * 2 + [(1, 5)]
    assert str(b[3][0, 2]) == "b^{Q2}_{3}" and str(b[-1][0, 0]) == "b^{O}_{1}"


def test_default_output_has_no_bias_symbols_and_zero_biases_change_nothing():
    dims = Dims(tokens=2, d_model=2, d_k=3, d_v=2, heads=1)
    Y, X, W = symbolic.output_rows(dims)
    assert not any(str(s).startswith("b^") for s in Y.free_symbols)
    b = symbolic.bias_vectors(dims)
    Yb = symbolic.multi_head_output(X, W, b)
    assert any(str(s).startswith("b^") for s in Yb.free_symbols)
    zero = {s: 0 for v in b for s in v}
    assert sp.simplify(Yb.subs(zero) - Y) == sp.zeros(2, 2)


@pytest.mark.parametrize("dims", [Dims(), Dims(tokens=4, d_model=2, d_k=3, d_v=5, heads=3)], ids=str)
def test_output_with_biases_agrees_with_numpy_and_stays_causal(dims):
    from mha_lit import init_weights
    from mha_lit.variants import reference

    X = symbolic.matrix("x", dims.tokens, dims.d_model)
    Y = symbolic.multi_head_output(X, symbolic.weight_matrices(dims), symbolic.bias_vectors(dims))
    assert symbolic.depends_on(Y, X) == [[j <= i for j in range(dims.tokens)]
                                         for i in range(dims.tokens)]
    Wn = init_weights(dims, seed=4, biases=True)
    Xn = np.random.default_rng(4).standard_normal((dims.tokens, dims.d_model))
    W, b = [], []
    for i in range(dims.heads):
        W += [sp.Matrix(Wn.W_Q[i]), sp.Matrix(Wn.W_K[i]), sp.Matrix(Wn.W_V[i])]
        b += [sp.Matrix([Wn.b_Q[i]]), sp.Matrix([Wn.b_K[i]]), sp.Matrix([Wn.b_V[i]])]
    exact = symbolic.multi_head_output(sp.Matrix(Xn), (*W, sp.Matrix(Wn.W_O)),
                                       (*b, sp.Matrix([Wn.b_O])))
    assert np.allclose(np.array(exact.evalf(), dtype=float),
                       reference(Xn, Wn), rtol=0, atol=1e-10)


def test_multi_head_output_refuses_biases_that_do_not_fit():
    dims = Dims()
    X, W, b = symbolic.matrix("x", 3, 5), symbolic.weight_matrices(dims), symbolic.bias_vectors(dims)
    with pytest.raises(ValueError, match="W has 7 matrices, b has 6 vectors"):
        symbolic.multi_head_output(X, W, b[:-1])
    with pytest.raises(ValueError, match=r"3 x 7 matrix must be 1 x 7, got 7 x 1"):
        symbolic.multi_head_output(X, W, (b[0].T, *b[1:]))


# --- chapter 19 additions: pairing, gradient ------------------------------------------------


@pytest.mark.parametrize("a, b, c", [(3, 5, 7), (2, 3, 1), (1, 1, 1), (5, 2, 3)])
def test_gradient_of_a_pairing_is_the_product_rule(a, b, c):
    """d<dR, A C>/dA = dR C^T and d<dR, A C>/dC = A^T dR, for symbols of every shape."""
    A, C, dR = symbolic.matrix("a", a, b), symbolic.matrix("c", b, c), symbolic.matrix("r", a, c)
    f = symbolic.pairing(dR, A * C)
    assert symbolic.gradient(f, A).shape == (a, b)
    assert sp.expand(symbolic.gradient(f, A) - dR * C.T) == sp.zeros(a, b)
    assert sp.expand(symbolic.gradient(f, C) - A.T * dR) == sp.zeros(b, c)


def test_pairing_is_the_sum_of_entrywise_products_and_agrees_with_numpy():
    rng = np.random.default_rng(19)
    G, A = rng.integers(-5, 6, (2, 3, 4))
    exact = symbolic.pairing(sp.Matrix(G), sp.Matrix(A))
    assert exact == int((G * A).sum())  # integers: exact
    x = symbolic.matrix("x", 2, 2)
    assert symbolic.pairing(sp.ones(2, 2), x) == sum(x)


def test_gradient_of_a_softmax_row_is_chapter_3s_jacobian():
    """diag(S_t) - S_t^T S_t, the derivative of a row of weights by its scores."""
    z = symbolic.matrix("z", 1, 3)
    S = symbolic.softmax(z)
    for u in range(3):
        row = symbolic.gradient(S[0, u], z)  # (1, 3)
        expected = sp.Matrix(1, 3, lambda _, v: S[0, u] * (int(u == v) - S[0, v]))
        assert sp.simplify(row - expected) == sp.zeros(1, 3)


def test_pairing_and_gradient_refuse_bad_input_naming_the_shapes():
    with pytest.raises(ValueError, match="G is 3 x 5, A is 5 x 3"):
        symbolic.pairing(symbolic.matrix("g", 3, 5), symbolic.matrix("a", 5, 3))
    x = symbolic.matrix("x", 2, 3)
    with pytest.raises(ValueError, match=r"entry \(1, 2\) of the 2 x 3 matrix is 2\*x_\{1,2\}"):
        symbolic.gradient(x[0, 0], sp.Matrix(2, 3, lambda i, j: 2 * x[i, j] if (i, j) == (0, 1)
                                             else x[i, j]))


def test_gradient_matrix_names_its_entries_with_an_upright_d():
    dR = symbolic.gradient_matrix("r", 3, 7)
    assert dR.shape == (3, 7)
    assert str(dR[2, 6]) == r"\mathrm{d}r_{3,7}"
    assert sp.latex(dR[0, 0]) == r"\mathrm{d}r_{1,1}"
    with pytest.raises(ValueError, match="rows"):
        symbolic.gradient_matrix("r", 0, 7)
