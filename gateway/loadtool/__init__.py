"""`gateway loadtest`: a bounded load generator for checking a deployment before clients arrive.

One job per module, data flowing one way:
  protocol.py  what one request looks like and how its answer is read (OpenAI chat / Anthropic messages)
  client.py    sends one request over httpx and times it -> RequestResult
  runner.py    the load: N workers per target, bounded by count or duration, alternating rounds
  stats.py     RequestResults -> Summary (percentiles, errors grouped, verdict, ratios)
  report.py    the terminal: live progress bar and summary tables (rich)
  html.py      one self-contained HTML page with inline SVG charts
  cli.py       argv -> the above; --json / --html files; Ctrl-C
"""
