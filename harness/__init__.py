"""attn-harness: the reference test harness for attention kernels.

Folders say what lives there: ``oracle/`` (FP64 references), ``cases.py`` / ``presets.py`` (the
case model), ``golden.py`` (golden store), ``tolerance.py`` (the pass rule), ``adapters/``
(one registry of backends), ``timing.py``, ``reports/``, ``plugin.py`` (pytest), ``cli.py``.
"""

__version__ = "0.1.0"
