"""The ``agenttape`` subcommands: one module per verb (``lake`` holds its three actions), layer 4 beside ``cli.py``.

Each verb module has ``run(args) -> int``, a thin shell over a public function (most read through
``otel_agenttape.open`` / ``Tapes``). They parse nothing themselves: ``cli.py`` builds the parser and calls
``run``. A command raises ``errors.CliError`` for a one-line error (exit 2); shared helpers: ``sources``
(what a command reads), ``output`` (tables and short values), ``keys`` (``--key``).
"""
