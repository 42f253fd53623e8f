"""aivitals.demo"""
