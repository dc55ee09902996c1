"""Report views rendered from results.json: terminal summary, HTML report, shard merge,
history database and trend dashboard."""
