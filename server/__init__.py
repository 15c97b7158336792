"""The faithproxy web server, in rooms by job. Each room imports only the rooms listed before it
(tests/test_layers.py holds the order):

    settings.py   every FAITHPROXY_* setting (pydantic-settings)
    protocol/     what a door is (Door, its renderer, its wires to vLLM), error bodies, SSE frames
    observe/      what an operator watches: metrics, OpenTelemetry, traces, reports
    admission/    what a request passes before it is served: keys, policy, limits, JSON guard, media URLs
    runtime/      the process: uvicorn, workers, supervisor, heap trim, the last-resort 500
    chain/        the async driver that runs faithcore's correction machine over one upstream stream
    state.py      AppState: the resources one app owns (key policies, the shadow checker...), built in its
                  lifespan; a room below reads it through a Protocol of its own (admission.admit.AdmissionState)
    doors/        the routes: the four model doors, one module each, and their one serving object (off
                  mode included); reports, pages, ops
    shadow/       the shadow check: sampled off requests verified after the fact, in the background
    app.py        create_app: the rooms put together
    cli.py        `faithproxy serve`, `segment`, `detectors`, `report`
"""
