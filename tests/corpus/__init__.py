"""A corpus of closure-style differentiators, converted and checked by tests/test_corpus.py.

Each module groups differentiators by theme. Every backward is written from the math with
differentiable torch operations, and together the forward statements that compute the
temporaries backward captures use every derivative rule of s2sgrad/autodiff/rules.py.
"""
