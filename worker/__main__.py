from .worker_cli import main

raise SystemExit(main())
