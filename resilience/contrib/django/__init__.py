"""Django support: add `"resilience.contrib.django"` to `INSTALLED_APPS`.

Its `AppConfig` (`apps.ResilienceConfig`) finds the project's Celery app and calls
`resilience.init_app(app)`, points the library at the Django database (unless
`CELERY_RESILIENCE_DATABASE_URL` says otherwise), runs a `transactional=True` body inside
`django.db.transaction.atomic` (`transaction.DjangoTransaction`), and carries the library's
tables as a migration, so `python manage.py migrate` creates them.
"""
