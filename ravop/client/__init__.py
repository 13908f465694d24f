"""The requester's session: `R.initialize`, activation, execution and tracking, fetching results, and the
facade `import ravop as R` offers (`requester`)."""
