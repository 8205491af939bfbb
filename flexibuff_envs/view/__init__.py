"""The episode browser (``flexibuff-envs view PATH...``): a page served on 127.0.0.1 that shows
recordings (episode logs, buffer files) as charts over episodes, a table of episodes, and one
episode's timeline and observations. `data` reads the recordings lazily (mapped); `server`
serves the page, its assets (shipped in ``static/``: uPlot, MIT) and a JSON API. Imports: `buffer`
and below."""
