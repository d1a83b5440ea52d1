"""``python -m otel_agenttape`` runs the ``agenttape`` command."""

import sys

from otel_agenttape.cli import main

sys.exit(main())
