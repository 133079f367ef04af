"""On-call irregularity reports: build a `Report`, render it as HTML, Markdown or JSON, alert."""
