"""Prime configurations the tests run over: the book's, plus others with d_k != d_v."""

from mha_lit import Dims

PRIME_DIMS = [
    Dims(),                                            # the book: 3, 5, 7, 11, 2
    Dims(tokens=2, d_model=3, d_k=5, d_v=7, heads=1),
    Dims(tokens=5, d_model=7, d_k=3, d_v=13, heads=3),
    Dims(tokens=7, d_model=11, d_k=13, d_v=2, heads=5),
    Dims(tokens=1, d_model=2, d_k=3, d_v=5, heads=7),
    Dims(tokens=13, d_model=17, d_k=19, d_v=23, heads=2),
]
