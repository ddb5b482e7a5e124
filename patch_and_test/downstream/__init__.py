"""The clients: their sp loss recipes, the downstream runs, the table and the census (floor 2)."""
