"""The report's sections, one module each. Every ``render`` takes the summary record (and what else
the section needs) and returns the section's HTML, escaped."""
