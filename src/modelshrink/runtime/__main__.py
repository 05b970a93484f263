"""`python -m modelshrink.runtime DIR --input docs.jsonl`: the torch-free command line."""

from .cli import main

raise SystemExit(main())
