"""Reports: an incident (from the journal) or a drill as one self-contained HTML page.

Pure rendering, from data to HTML and SVG written by hand: ``model.py`` (what a page shows),
``series.py`` (a GPU's readings, thinned only for drawing), ``from_journal.py`` and
``from_drill.py`` (filling the model from each source), ``chart.py`` (one GPU's figure),
``svg.py`` (escaping, scales, shapes), ``tables.py`` and ``page.py`` (the document). The
commands that read the journal, run the drill and write the file are in ``cli/report.py`` and
``cli/check.py``; docs/reports.md explains how to read a report.
"""
