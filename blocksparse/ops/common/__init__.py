"""Pieces several op families share."""
