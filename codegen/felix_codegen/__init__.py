"""Compile the Felix protocol catalogue (spec/*.yaml) into the generated wire layer.

Layout:
  model.py   - typed, cross-checked view of the catalogue (what the templates read)
  load.py    - reads the YAML, validates it against spec/catalogue.schema.json,
               then checks every cross-reference (gates, types, flags, answers)
  requirements.py - reads spec/requirements.yaml, validates it against
               spec/requirements.schema.json and checks its cross-references
  render.py  - Jinja environment, rendering, formatting and writing the files
  schemas.py - JSON Schema documents per message, for other implementers
  templates/ - one template per generated module

Nothing in the project imports this package at run time; `make codegen` runs it.
"""
