"""The scaling report's core (the job behind generators/report.py): measurements.py reads benchmark
and trainer results into scaling points, render.py makes the table, report.md and the charts
(svgchart.py)."""
