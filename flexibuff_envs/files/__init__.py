"""Buffer files: a buffer's rows in one file, written by `io` and opened, checked and read by
`format`, with its header (`header`, `header_values`); and `Chunk` (`chunk`), whole episodes in
the stored form, to move between buffers and processes. Imports: `sampling` and below."""
