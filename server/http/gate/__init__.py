"""What every request passes before a route sees it: the ASGI middleware (``middleware``), the API
key check (``auth``), CORS (``cors``) and the response headers' names as upstream spells them
(``header_names``). The body limits themselves are ``limits``: the plan reads them too."""
