"""Autodiff: vector-Jacobian code for promoted temporaries, from derivative rules.

`plan.differentiate` takes a `Lifted` record and returns a `Differentiated` one
(`record.py`) with its gradients planned;
`rules.py` holds the derivative rules (differentiators themselves), `registry.py` finds
them by qualified name, `program.py` versions the forward statements, `vjp.py` emits the
reverse-mode code, `inline.py` inlines one rule at a call site and `forward.py` writes
forward's statements with the values that code reads (snapshots, named tests).
"""
