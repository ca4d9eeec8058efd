"""Foundations every layer uses: typed config, user errors, the output channel, and where runs are written."""
