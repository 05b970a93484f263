"""Predicting, scoring, comparing."""
