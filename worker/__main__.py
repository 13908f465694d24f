from .serve.worker_cli import main

raise SystemExit(main())
