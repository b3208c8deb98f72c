"""Review of generated code: `--check`/`--diff` results and `s2sgrad review` reports.

`model` builds plain records from the engine's intermediate results; `check` compares
generated text with what is on disk; `text` and `page` render records for a terminal
and as a self-contained HTML page. Nothing here reads or writes files: the CLI does.
"""
