"""Loading and checking models, shrinking them into students, measuring them."""
