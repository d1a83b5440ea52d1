"""The ``agenttape`` subcommands, one module per area (layer 4, beside ``cli.py``).

They parse nothing themselves: ``cli.py`` builds the parser and calls ``cmd_*(args)``; these modules
open sources, call the library and print.
"""
