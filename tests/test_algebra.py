"""Tests for :mod:`hyperplex.algebra`: Cayley–Dickson rules and hypercomplex operations.

Conventions under test: a hypercomplex vector is a real tensor whose last dimension holds
the ``n`` components one after another (``[r; x; y; z]`` for quaternions), and a rule
tensor ``rule`` of shape ``(n, n, n)`` has ``rule[i] = A_i`` (PHM paper, Zhang et al. 2021,
eq. 3.5) with ``(q ⊗ p)_a = Σ_{i,c} rule[i, a, c] q_i p_c``.

Exact tables use plain pytest; algebraic laws use ``hypothesis`` on float64 tensors with
entries in [-10, 10]; "this law fails" claims use fixed seeded random batches.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hyperplex.algebra import (
    ALGEBRAS,
    algebra_rule,
    cayley_dickson_rule,
    component_activation,
    conjugate,
    hamilton,
    merge_components,
    multiply,
    norm,
    normalize,
    split_components,
)

F64 = torch.float64
DIMS = (1, 2, 4, 8, 16)

# --------------------------------------------------------------------------------------
# Helpers and strategies
# --------------------------------------------------------------------------------------

FLOATS = st.floats(min_value=-10.0, max_value=10.0, allow_nan=False, allow_infinity=False, width=64)
FAST = settings(max_examples=40, deadline=None)

# Absolute tolerance for identities between products of up to three factors with entries
# in [-10, 10]: round-off there is ~1e-11 at worst, a wrong table gives errors of order 1.
ATOL = 1e-9
RTOL = 1e-9


@st.composite
def hc_tensors(draw, n: int, count: int = 1, max_batch: int = 3, max_m: int = 3):
    """``count`` float64 tensors of the same shape ``(B, n·m)`` built from lists of floats."""
    b = draw(st.integers(1, max_batch))
    m = draw(st.integers(1, max_m))
    size = b * n * m
    out = []
    for _ in range(count):
        values = draw(st.lists(FLOATS, min_size=size, max_size=size))
        out.append(torch.tensor(values, dtype=F64).reshape(b, n * m))
    return out


def rule64(n: int) -> torch.Tensor:
    return cayley_dickson_rule(n, dtype=F64)


def mul(n: int):
    """Product of the ``n``-dimensional Cayley–Dickson algebra on float64 tensors."""
    rule = rule64(n)
    return lambda x, y: multiply(x, y, rule)


def basis(n: int) -> torch.Tensor:
    """Rows are the basis units e_0 .. e_{n-1} as single hypercomplex numbers (m = 1)."""
    return torch.eye(n, dtype=F64)


def seeded(n: int, count: int = 3, batch: int = 1000, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, n, generator=g, dtype=F64) for _ in range(count)]


def assert_close(actual, expected, rtol=RTOL, atol=ATOL):
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


# --------------------------------------------------------------------------------------
# 1. Exact rule tables (PHM eq. 3.5)
# --------------------------------------------------------------------------------------

PHM_A1 = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]
PHM_A2 = [[0, -1, 0, 0], [1, 0, 0, 0], [0, 0, 0, -1], [0, 0, 1, 0]]
PHM_A3 = [[0, 0, -1, 0], [0, 0, 0, 1], [1, 0, 0, 0], [0, -1, 0, 0]]
PHM_A4 = [[0, 0, 0, -1], [0, 0, -1, 0], [0, 1, 0, 0], [1, 0, 0, 0]]


def test_quaternion_rule_equals_phm_eq_3_5():
    """cayley_dickson_rule(4)[i] is exactly A_{i+1} of PHM eq. 3.5."""
    expected = torch.tensor([PHM_A1, PHM_A2, PHM_A3, PHM_A4], dtype=F64)
    rule = cayley_dickson_rule(4, dtype=F64)
    assert rule.shape == (4, 4, 4)
    assert torch.equal(rule, expected)


def test_algebra_rule_quaternion_equals_cayley_dickson_4():
    """algebra_rule('quaternion') is the same table as cayley_dickson_rule(4)."""
    assert torch.equal(algebra_rule("quaternion", dtype=F64), cayley_dickson_rule(4, dtype=F64))


@pytest.mark.parametrize("name,n", list(ALGEBRAS.items()))
def test_algebra_rule_matches_dimension(name, n):
    """Every named algebra maps to the Cayley–Dickson table of its dimension."""
    assert ALGEBRAS[name] == n
    assert torch.equal(algebra_rule(name, dtype=F64), cayley_dickson_rule(n, dtype=F64))


def test_algebra_names_and_dimensions():
    """The five Cayley–Dickson algebras and their dimensions 2^k, k = 0..4."""
    assert ALGEBRAS == {"real": 1, "complex": 2, "quaternion": 4, "octonion": 8, "sedenion": 16}


def test_real_rule_is_one():
    """The 1-dimensional algebra is R: rule = [[[1]]]."""
    assert torch.equal(cayley_dickson_rule(1, dtype=F64), torch.tensor([[[1.0]]], dtype=F64))


def test_complex_rule():
    """Complex numbers: 1·1 = 1, 1·i = i·1 = i, i·i = −1."""
    rule = cayley_dickson_rule(2, dtype=F64)
    assert torch.equal(rule[1, :, 1], torch.tensor([-1.0, 0.0], dtype=F64))  # i*i = -1
    expected = torch.tensor([[[1, 0], [0, 1]], [[0, -1], [1, 0]]], dtype=F64)
    assert torch.equal(rule, expected)


def test_rule_dtype_and_default_dtype():
    """dtype= is honoured; without it the rule uses torch's default dtype."""
    assert cayley_dickson_rule(4, dtype=F64).dtype == F64
    assert cayley_dickson_rule(4, dtype=torch.float32).dtype == torch.float32
    assert cayley_dickson_rule(4).dtype == torch.get_default_dtype()
    assert algebra_rule("octonion", dtype=torch.float16).dtype == torch.float16


def test_rule_mutation_does_not_leak_into_cache():
    """Returned rules are fresh tensors: mutating one does not change later calls."""
    rule = cayley_dickson_rule(4, dtype=F64)
    rule.zero_()
    again = cayley_dickson_rule(4, dtype=F64)
    assert torch.equal(again[1], torch.tensor(PHM_A2, dtype=F64))


# --------------------------------------------------------------------------------------
# 12. Rule structure for every dimension
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", DIMS)
def test_rule_entries_are_signed_permutation(n):
    """Entries in {−1, 0, 1}; e_i e_c = ±e_a for exactly one a (one non-zero per rule[:, a, c])."""
    rule = rule64(n)
    assert rule.shape == (n, n, n)
    assert bool(((rule == -1) | (rule == 0) | (rule == 1)).all())
    assert torch.equal((rule != 0).sum(dim=0), torch.ones(n, n, dtype=torch.long))
    # Equivalently, each product of two basis units is a single signed basis unit.
    assert torch.equal((rule != 0).sum(dim=1), torch.ones(n, n, dtype=torch.long))


@pytest.mark.parametrize("n", DIMS)
def test_e0_is_two_sided_identity(n):
    """e_0 e_c = e_c (rule[0] = I) and e_i e_0 = e_i (rule[:, :, 0] = I)."""
    rule = rule64(n)
    eye = torch.eye(n, dtype=F64)
    assert torch.equal(rule[0], eye)
    assert torch.equal(rule[:, :, 0], eye)


@pytest.mark.parametrize("n", DIMS[1:])
def test_imaginary_units_square_to_minus_one_and_anticommute(n):
    """e_i² = −1 for i ≥ 1, and e_i e_j = −e_j e_i for distinct imaginary units."""
    rule = rule64(n)
    for i in range(1, n):
        expected = torch.zeros(n, dtype=F64)
        expected[0] = -1
        assert torch.equal(rule[i, :, i], expected)
        for j in range(1, n):
            if j != i:
                assert torch.equal(rule[i, :, j], -rule[j, :, i])
                assert rule[i, 0, j] == 0  # product of distinct imaginary units is imaginary


@pytest.mark.parametrize("n", DIMS[1:])
def test_doubling_embeds_lower_algebra(n):
    """Cayley–Dickson doubling: the first n/2 units multiply as the n/2-dimensional algebra."""
    h = n // 2
    rule, lower = rule64(n), rule64(h)
    assert torch.equal(rule[:h, :h, :h], lower)
    assert bool((rule[:h, h:, :h] == 0).all())


# --------------------------------------------------------------------------------------
# 2. Hamilton product (PHM eq. 2.2) and multiply() with the quaternion rule
# --------------------------------------------------------------------------------------


@FAST
@given(st.lists(FLOATS, min_size=8, max_size=8))
def test_hamilton_matches_eq_2_2_termwise(values):
    """hamilton(q, p) for single quaternions equals PHM eq. 2.2 written out with scalars."""
    Qr, Qx, Qy, Qz, Pr, Px, Py, Pz = values
    q = torch.tensor([Qr, Qx, Qy, Qz], dtype=F64)
    p = torch.tensor([Pr, Px, Py, Pz], dtype=F64)
    expected = torch.tensor(
        [
            Qr * Pr - Qx * Px - Qy * Py - Qz * Pz,
            Qx * Pr + Qr * Px - Qz * Py + Qy * Pz,
            Qy * Pr + Qz * Px + Qr * Py - Qx * Pz,
            Qz * Pr - Qy * Px + Qx * Py + Qr * Pz,
        ],
        dtype=F64,
    )
    out = hamilton(q, p)
    assert out.shape == (4,)
    assert_close(out, expected)
    assert_close(multiply(q, p, rule64(4)), expected)


@FAST
@given(hc_tensors(4, count=2))
def test_multiply_quaternion_rule_equals_hamilton(qp):
    """multiply(q, p, cayley_dickson_rule(4)) == hamilton(q, p) for batches of shape (B, 4m)."""
    q, p = qp
    out = multiply(q, p, rule64(4))
    assert out.shape == q.shape
    assert_close(out, hamilton(q, p))


def test_multiply_componentwise_over_numbers():
    """With m > 1, number j of the output uses only number j of each input (component blocks)."""
    g = torch.Generator().manual_seed(1)
    m = 3
    q, p = torch.randn(2, 4 * m, generator=g, dtype=F64), torch.randn(2, 4 * m, generator=g, dtype=F64)
    out = split_components(hamilton(q, p), 4)
    qs, ps = split_components(q, 4), split_components(p, 4)
    for j in range(m):
        assert_close(out[..., j], hamilton(qs[..., j], ps[..., j]))


def test_multiply_broadcasts_and_casts_rule_dtype():
    """q (1, 4m) broadcasts against p (B, 4m); a float32 rule is cast to the inputs' dtype."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 8, generator=g, dtype=F64)
    p = torch.randn(5, 8, generator=g, dtype=F64)
    out = multiply(q, p, cayley_dickson_rule(4, dtype=torch.float32))
    assert out.shape == (5, 8) and out.dtype == F64
    assert_close(out, hamilton(q.expand(5, 8), p))


def test_hamilton_example_values():
    """A worked example: (1 + 2i + 3j + 4k)(5 + 6i + 7j + 8k) = −60 + 12i + 30j + 24k."""
    q = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64)
    p = torch.tensor([5.0, 6.0, 7.0, 8.0], dtype=F64)
    expected = torch.tensor([-60.0, 12.0, 30.0, 24.0], dtype=F64)
    assert torch.equal(hamilton(q, p), expected)
    assert torch.equal(multiply(q, p, rule64(4)), expected)


# --------------------------------------------------------------------------------------
# 3. Quaternion unit products
# --------------------------------------------------------------------------------------

_E = basis(4)
ONE, QI, QJ, QK = _E[0], _E[1], _E[2], _E[3]


@pytest.mark.parametrize(
    "lhs,rhs,expected",
    [
        pytest.param(QI, QJ, QK, id="ij=k"),
        pytest.param(QJ, QK, QI, id="jk=i"),
        pytest.param(QK, QI, QJ, id="ki=j"),
        pytest.param(QJ, QI, -QK, id="ji=-k"),
        pytest.param(QK, QJ, -QI, id="kj=-i"),
        pytest.param(QI, QK, -QJ, id="ik=-j"),
        pytest.param(QI, QI, -ONE, id="ii=-1"),
        pytest.param(QJ, QJ, -ONE, id="jj=-1"),
        pytest.param(QK, QK, -ONE, id="kk=-1"),
        pytest.param(ONE, QK, QK, id="1k=k"),
    ],
)
def test_quaternion_unit_products(lhs, rhs, expected):
    """Hamilton's rules for the units i, j, k (both via multiply and hamilton)."""
    assert torch.equal(multiply(lhs, rhs, rule64(4)), expected)
    assert torch.equal(hamilton(lhs, rhs), expected)


def test_ijk_is_minus_one():
    """i j k = −1 (Hamilton's i² = j² = k² = ijk = −1)."""
    m = mul(4)
    assert torch.equal(m(m(QI, QJ), QK), -ONE)
    assert torch.equal(hamilton(hamilton(QI, QJ), QK), -ONE)


# --------------------------------------------------------------------------------------
# 4. Multiplicative norm |pq| = |p||q| (composition algebras) and its failure for sedenions
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_norm_is_multiplicative_property(n):
    """|p q| = |p| |q| for R, C, H, O (Hurwitz composition algebras)."""

    @FAST
    @given(hc_tensors(n, count=2))
    def check(pq):
        p, q = pq
        assert_close(norm(mul(n)(p, q), n), norm(p, n) * norm(q, n), rtol=1e-9, atol=1e-12)

    check()


def test_norm_is_euclidean_per_number():
    """norm(x, n) is the Euclidean norm of each number's n components: (..., n·m) → (..., m)."""
    x = torch.tensor([[3.0, 1.0, 4.0, 2.0, 0.0, 2.0, 0.0, 1.0]], dtype=F64)  # m = 2
    # number 0 = (3, 4, 0, 0), number 1 = (1, 2, 2, 1)
    assert torch.equal(norm(x, 4), torch.tensor([[5.0, 10.0**0.5]], dtype=F64))
    assert norm(x, 4).shape == (1, 2)


def test_sedenion_norm_is_not_multiplicative():
    """Sedenions are not a composition algebra: |pq| ≠ |p||q| on a seeded random batch."""
    p, q = seeded(16, count=2)
    lhs, rhs = norm(mul(16)(p, q), 16), norm(p, 16) * norm(q, 16)
    assert ((lhs - rhs).abs() / rhs).max() > 1e-2


def test_sedenion_classic_zero_divisor():
    """(e3 + e10)(e6 − e15) = 0 in the standard Cayley–Dickson sedenions."""
    e = basis(16)
    a, b = e[3] + e[10], e[6] - e[15]
    assert norm(a, 16).item() > 0 and norm(b, 16).item() > 0
    assert torch.equal(mul(16)(a, b), torch.zeros(16, dtype=F64))
    # Sign matters: (e3 + e10)(e6 + e15) = 2 e5 + 2 e12 is not zero.
    expected = 2 * e[5] + 2 * e[12]
    assert torch.equal(mul(16)(a, e[6] + e[15]), expected)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_no_basis_pair_zero_divisors_below_sedenions(n):
    """Division algebras have no zero divisors of the form (e_a ± e_b)(e_c ± e_d)."""
    e, m = basis(n), mul(n)
    xs = torch.stack([e[a] + s * e[b] for a in range(n) for b in range(a + 1, n) for s in (1.0, -1.0)])
    prods = m(xs.unsqueeze(1), xs.unsqueeze(0))  # all pairs by broadcasting
    assert bool((prods.abs().amax(dim=-1) > 0).all())


# --------------------------------------------------------------------------------------
# 5. Associativity, alternativity, flexibility
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 4])
def test_associative_up_to_quaternions(n):
    """(p q) r = p (q r) for R, C, H."""

    @FAST
    @given(hc_tensors(n, count=3))
    def check(pqr):
        p, q, r = pqr
        m = mul(n)
        assert_close(m(m(p, q), r), m(p, m(q, r)))

    check()


def test_octonion_basis_triple_not_associative():
    """Octonions are not associative: (e1 e2) e4 = e7 but e1 (e2 e4) = −e7."""
    e, m = basis(8), mul(8)
    assert torch.equal(m(m(e[1], e[2]), e[4]), e[7])
    assert torch.equal(m(e[1], m(e[2], e[4])), -e[7])


def test_octonion_random_not_associative():
    """On a seeded random batch the associator (xy)z − x(yz) is of the order of |x||y||z|."""
    x, y, z = seeded(8)
    m = mul(8)
    dev = (m(m(x, y), z) - m(x, m(y, z))).norm(dim=-1) / (x.norm(dim=-1) * y.norm(dim=-1) * z.norm(dim=-1))
    assert dev.max() > 0.5


@pytest.mark.parametrize("n", [8, 16])
def test_octonion_and_sedenion_basis_associator_count(n):
    """Number of non-associative ordered triples of imaginary basis units is non-zero."""
    e, m = basis(n), mul(n)
    a = e[1:].reshape(-1, 1, 1, n)
    b = e[1:].reshape(1, -1, 1, n)
    c = e[1:].reshape(1, 1, -1, n)
    assoc = m(m(a, b), c) - m(a, m(b, c))
    bad = int((assoc.abs().amax(dim=-1) > 0).sum())
    if n == 8:
        # 7 units: a triple is associative iff it lies in a quaternion subalgebra (a line of
        # the Fano plane) or repeats a unit; the other 7·6·4 = 168 ordered triples are not.
        assert bad == 168
    else:
        assert bad > 168


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_alternative_laws(n):
    """Left (x x) y = x (x y) and right (y x) x = y (x x) alternativity, up to octonions."""

    @FAST
    @given(hc_tensors(n, count=2))
    def check(xy):
        x, y = xy
        m = mul(n)
        assert_close(m(m(x, x), y), m(x, m(x, y)))
        assert_close(m(m(y, x), x), m(y, m(x, x)))

    check()


@pytest.mark.parametrize("n", [8, 16])
def test_flexible_law(n):
    """Flexibility (x y) x = x (y x) holds for octonions (and all Cayley–Dickson algebras)."""

    @FAST
    @given(hc_tensors(n, count=2))
    def check(xy):
        x, y = xy
        m = mul(n)
        assert_close(m(m(x, y), x), m(x, m(y, x)))

    check()


def test_sedenions_not_alternative():
    """Sedenions are not alternative: (x x) y ≠ x (x y) and (y x) x ≠ y (x x) on random data."""
    x, y = seeded(16, count=2)
    m = mul(16)
    scale = x.norm(dim=-1) ** 2 * y.norm(dim=-1)
    left = (m(m(x, x), y) - m(x, m(x, y))).norm(dim=-1) / scale
    right = (m(m(y, x), x) - m(y, m(x, x))).norm(dim=-1) / scale
    assert left.max() > 1e-2
    assert right.max() > 1e-2


# --------------------------------------------------------------------------------------
# 6. Complex numbers vs torch's complex multiplication
# --------------------------------------------------------------------------------------


@FAST
@given(hc_tensors(2, count=2))
def test_complex_rule_matches_torch_complex(zw):
    """multiply with the complex rule == torch complex multiplication ([re; im] layout)."""
    z, w = zw
    zs, ws = split_components(z, 2), split_components(w, 2)
    zc = torch.complex(zs[..., 0, :], zs[..., 1, :])
    wc = torch.complex(ws[..., 0, :], ws[..., 1, :])
    prod = zc * wc
    expected = torch.cat([prod.real, prod.imag], dim=-1)
    assert_close(multiply(z, w, rule64(2)), expected)


def test_complex_rule_matches_view_as_complex():
    """Same check via torch.view_as_complex on an interleaved (re, im) view."""
    g = torch.Generator().manual_seed(3)
    z, w = torch.randn(4, 2, generator=g, dtype=F64), torch.randn(4, 2, generator=g, dtype=F64)
    expected = torch.view_as_real(torch.view_as_complex(z) * torch.view_as_complex(w))
    assert_close(multiply(z, w, rule64(2)), expected)


# --------------------------------------------------------------------------------------
# 7. Conjugation
# --------------------------------------------------------------------------------------


def test_conjugate_negates_imaginary_components():
    """conj keeps the real block and negates the n − 1 imaginary blocks."""
    x = torch.arange(1.0, 9.0, dtype=F64)  # n = 4, m = 2
    expected = torch.tensor([1.0, 2.0, -3.0, -4.0, -5.0, -6.0, -7.0, -8.0], dtype=F64)
    assert torch.equal(conjugate(x, 4), expected)
    assert torch.equal(conjugate(x, 2), torch.tensor([1.0, 2.0, 3.0, 4.0, -5.0, -6.0, -7.0, -8.0], dtype=F64))


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_conjugate_is_anti_automorphism(n):
    """conj(p q) = conj(q) conj(p)."""

    @FAST
    @given(hc_tensors(n, count=2))
    def check(pq):
        p, q = pq
        m = mul(n)
        assert_close(conjugate(m(p, q), n), m(conjugate(q, n), conjugate(p, n)))

    check()


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_q_times_conjugate_is_squared_norm(n):
    """q conj(q) = conj(q) q = |q|² (real part |q|², imaginary parts zero)."""

    @FAST
    @given(hc_tensors(n))
    def check(qs):
        (q,) = qs
        m = mul(n)
        expected = torch.zeros_like(split_components(q, n))
        expected[..., 0, :] = norm(q, n) ** 2
        expected = merge_components(expected)
        assert_close(m(q, conjugate(q, n)), expected)
        assert_close(m(conjugate(q, n), q), expected)

    check()


@pytest.mark.parametrize("n", DIMS)
def test_conjugate_is_involution_and_isometry(n):
    """conj(conj(q)) = q exactly, and |conj(q)| = |q|."""

    @FAST
    @given(hc_tensors(n))
    def check(qs):
        (q,) = qs
        assert torch.equal(conjugate(conjugate(q, n), n), q)
        assert torch.equal(norm(conjugate(q, n), n), norm(q, n))

    check()


# --------------------------------------------------------------------------------------
# 8. normalize
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4, 8])
def test_normalize_gives_unit_norm(n):
    """|normalize(x)| = 1 and normalize(x) = x / |x| for non-zero numbers."""

    @FAST
    @given(hc_tensors(n))
    def check(xs):
        (x,) = xs
        x = x + 0.5 * (x >= 0) - 0.5 * (x < 0)  # every entry has |.| ≥ 0.5: no zero numbers
        u = normalize(x, n)
        assert u.shape == x.shape
        assert_close(norm(u, n), torch.ones_like(norm(x, n)))
        assert_close(split_components(u, n) * norm(x, n).unsqueeze(-2), split_components(x, n))

    check()


def test_normalize_zero_stays_finite():
    """The zero number maps to zero (no NaN/inf); its non-zero neighbours are still unit."""
    x = torch.tensor([[0.0, 3.0, 0.0, 4.0, 0.0, 0.0, 0.0, 0.0]], dtype=F64)  # m = 2: 0 and 3+4i
    u = normalize(x, 4)
    assert bool(torch.isfinite(u).all())
    assert torch.equal(split_components(u, 4)[..., 0], torch.zeros(1, 4, dtype=F64))
    assert_close(split_components(u, 4)[..., 1], torch.tensor([[0.6, 0.8, 0.0, 0.0]], dtype=F64))
    assert bool(torch.isfinite(normalize(torch.zeros(3, 16), 4)).all())


def test_unit_quaternion_product_is_unit():
    """Unit quaternions form a group under multiplication: |û v̂| = 1."""
    p, q = seeded(4, count=2)
    out = hamilton(normalize(p, 4), normalize(q, 4))
    assert_close(norm(out, 4), torch.ones(p.shape[0], 1, dtype=F64))


# --------------------------------------------------------------------------------------
# 9. split/merge components and error handling
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,m", [(1, 5), (2, 3), (4, 1), (4, 3), (8, 2), (16, 1)])
def test_split_component_ordering(n, m):
    """Component i of a (..., n·m) tensor is x[..., i·m:(i+1)·m]."""
    x = torch.arange(2 * n * m, dtype=F64).reshape(2, n * m)
    parts = split_components(x, n)
    assert parts.shape == (2, n, m)
    for i in range(n):
        assert torch.equal(parts[:, i, :], x[:, i * m : (i + 1) * m])


@FAST
@given(st.sampled_from(DIMS), st.integers(1, 4), st.integers(1, 3))
def test_split_merge_round_trip(n, m, b):
    """merge(split(x)) = x and split(merge(y)) = y."""
    x = torch.randn(b, 3, n * m, dtype=F64)
    assert torch.equal(merge_components(split_components(x, n)), x)
    y = torch.randn(b, n, m, dtype=F64)
    assert torch.equal(split_components(merge_components(y), n), y)


def test_split_default_is_quaternion():
    """num_components defaults to 4 in split_components, conjugate, norm and normalize."""
    x = torch.arange(8.0)
    assert split_components(x).shape == (4, 2)
    assert torch.equal(conjugate(x), conjugate(x, 4))
    assert torch.equal(norm(x), norm(x, 4))


@pytest.mark.parametrize("n,d", [(4, 10), (8, 12), (16, 8), (3, 4), (0, 4)])
def test_split_not_divisible_raises(n, d):
    """split_components raises ValueError when the last dim is not divisible by n (or n < 1)."""
    with pytest.raises(ValueError):
        split_components(torch.zeros(2, d), n)


def test_ops_on_non_divisible_input_raise():
    """multiply, hamilton, conjugate, norm, normalize, component_activation validate the shape."""
    x = torch.zeros(2, 6, dtype=F64)
    for call in (
        lambda: multiply(x, x, rule64(4)),
        lambda: hamilton(x, x),
        lambda: conjugate(x, 4),
        lambda: norm(x, 4),
        lambda: normalize(x, 4),
        lambda: component_activation(x, torch.relu, 4),
    ):
        with pytest.raises(ValueError):
            call()


@pytest.mark.parametrize("n", [0, 3, 5, 6, 32])
def test_cayley_dickson_rule_invalid_n_lists_valid_choices(n):
    """cayley_dickson_rule(n) for n ∉ {1, 2, 4, 8, 16} raises ValueError naming the valid n."""
    with pytest.raises(ValueError) as info:
        cayley_dickson_rule(n)
    msg = str(info.value)
    for valid in DIMS:
        assert re.search(rf"(?<!\d){valid}(?!\d)", msg), msg


def test_algebra_rule_bogus_lists_valid_names():
    """algebra_rule('bogus') raises ValueError listing every valid algebra name."""
    with pytest.raises(ValueError) as info:
        algebra_rule("bogus")
    msg = str(info.value)
    assert "bogus" in msg
    for name in ALGEBRAS:
        assert name in msg, msg


@pytest.mark.parametrize("shape", [(4, 4, 2), (2, 4, 4), (4, 4), (4, 4, 4, 1), (4, 2, 4)])
def test_multiply_rejects_wrong_rule_shape(shape):
    """multiply raises ValueError unless rule has shape (n, n, n)."""
    x = torch.zeros(3, 8)
    with pytest.raises(ValueError):
        multiply(x, x, torch.zeros(shape))


# --------------------------------------------------------------------------------------
# 10. component_activation
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_component_activation_elementwise_equals_plain(n):
    """For element-wise functions (ReLU, tanh) component_activation(x, f) == f(x)."""
    x = torch.randn(3, n * 5, dtype=F64, generator=torch.Generator().manual_seed(4))
    assert torch.equal(component_activation(x, torch.relu, n), torch.relu(x))
    assert torch.equal(component_activation(x, torch.tanh, n), torch.tanh(x))


@pytest.mark.parametrize("n", [2, 4, 8])
def test_component_activation_softmax_per_component(n):
    """A softmax over the last dim is applied per component: each block sums to 1 on its own."""
    m = 5
    x = torch.randn(3, n * m, dtype=F64, generator=torch.Generator().manual_seed(5))
    out = component_activation(x, lambda t: torch.softmax(t, dim=-1), n)
    assert out.shape == x.shape
    sums = split_components(out, n).sum(dim=-1)  # (3, n)
    assert_close(sums, torch.ones(3, n, dtype=F64))
    for i in range(n):
        assert_close(out[:, i * m : (i + 1) * m], torch.softmax(x[:, i * m : (i + 1) * m], dim=-1))
    # and it is not the softmax over the whole feature axis
    assert not torch.allclose(out, torch.softmax(x, dim=-1))


def test_component_activation_receives_one_component_at_a_time():
    """The activation sees tensors of shape (..., m), n times, in component order."""
    seen = []

    def spy(t):
        seen.append(t.clone())
        return t * 2

    x = torch.arange(12.0).reshape(1, 12)
    out = component_activation(x, spy, 4)
    assert [t.shape for t in seen] == [torch.Size([1, 3])] * 4
    for i, t in enumerate(seen):
        assert torch.equal(t, x[:, 3 * i : 3 * i + 3])
    assert torch.equal(out, 2 * x)


# --------------------------------------------------------------------------------------
# 11. Differentiability (PHM learns the rule)
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 4])
def test_multiply_gradcheck_q_p_rule(n):
    """torch.autograd.gradcheck of multiply w.r.t. q, p and the rule (float64)."""
    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, n * 2, generator=g, dtype=F64, requires_grad=True)
    p = torch.randn(2, n * 2, generator=g, dtype=F64, requires_grad=True)
    rule = (rule64(n) + 0.1 * torch.randn(n, n, n, generator=g, dtype=F64)).requires_grad_(True)
    assert torch.autograd.gradcheck(multiply, (q, p, rule))


def test_rule_gradient_is_outer_product_sum():
    """∂/∂rule[i,a,c] of Σ w_a·out_a equals Σ_{batch,m} w_a q_i p_c (product is trilinear)."""
    g = torch.Generator().manual_seed(7)
    n, m = 4, 3
    q = torch.randn(5, n * m, generator=g, dtype=F64)
    p = torch.randn(5, n * m, generator=g, dtype=F64)
    w = torch.randn(5, n * m, generator=g, dtype=F64)
    rule = rule64(n).requires_grad_(True)
    (multiply(q, p, rule) * w).sum().backward()
    qs, ps, ws = (split_components(t, n) for t in (q, p, w))
    expected = torch.einsum("bim,bam,bcm->iac", qs, ws, ps)
    assert_close(rule.grad, expected)


def test_multiply_is_bilinear():
    """(α q1 + q2) p = α q1 p + q2 p and q (α p1 + p2) = α q p1 + q p2 for a generic rule."""
    g = torch.Generator().manual_seed(8)
    n = 8
    rule = torch.randn(n, n, n, generator=g, dtype=F64)
    q1, q2, p1, p2 = (torch.randn(3, n * 2, generator=g, dtype=F64) for _ in range(4))
    alpha = 1.7
    assert_close(multiply(alpha * q1 + q2, p1, rule), alpha * multiply(q1, p1, rule) + multiply(q2, p1, rule))
    assert_close(multiply(q1, alpha * p1 + p2, rule), alpha * multiply(q1, p1, rule) + multiply(q1, p2, rule))
