"""`python -m s2sgrad` runs the command line."""

from s2sgrad.cli import command_line

command_line()
