"""Shipped run records (JSON) as package data."""
