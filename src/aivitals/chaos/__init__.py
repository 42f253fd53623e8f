"""aivitals.chaos"""
