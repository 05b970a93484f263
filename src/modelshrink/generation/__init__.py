"""Writing summaries and translations: settings, PLATE, many processes, fixed-shape search."""
