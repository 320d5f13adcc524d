"""``python -m cli``: the ``abps`` command (how ``abps launch`` starts its peers with the same interpreter)."""

from cli.entry import main

main()
