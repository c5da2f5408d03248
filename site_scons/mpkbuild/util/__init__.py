"""Small shared helpers: paths and settings, atomic files, spec expressions."""
