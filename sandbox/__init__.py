"""Agent Ledger's provider simulator: a stand-alone, standard-library-only HTTP service.

Run it with ``python -m sandbox``. It never imports Django and keeps its own SQLite file, so a
provider commit is independent of anything the ledger does (DESIGN.md §4.5).
"""
