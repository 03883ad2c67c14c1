from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = get_wsgi_application()

from config.checks import secret_key_errors  # noqa: E402  (needs the settings configured)

if secret_key_errors():
    # Production never serves with an empty, short or development secret key.
    raise ImproperlyConfigured(secret_key_errors()[0].msg)
# A broken tool catalogue refuses to start the web process (the system check names each problem).
from ledger.tools import catalogue  # noqa: E402

catalogue()
