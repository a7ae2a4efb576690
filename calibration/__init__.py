"""Run records, fitting the model to them, prediction bands and adjudication."""
