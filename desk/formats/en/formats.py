"""One date format across the admin (change lists, forms' read-only fields, the desk's pages): ISO dates and
24-hour times with the zone, as the desk's own pages write them (settings.FORMAT_MODULE_PATH)."""

DATE_FORMAT = "Y-m-d"
DATETIME_FORMAT = "Y-m-d H:i T"
TIME_FORMAT = "H:i"
SHORT_DATE_FORMAT = "Y-m-d"
SHORT_DATETIME_FORMAT = "Y-m-d H:i T"
