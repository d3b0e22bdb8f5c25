"""Checked reading of YAML mappings: every error names the file, the entry and the key.

The data files of the harness (``matrix.yaml``, ``ci/known_failures.yaml``) are small, so a
typed reader with precise messages serves better than a generic schema engine: unknown keys get a
"did you mean" suggestion, and YAML's number trap (``3.10`` read as ``3.1``) is named outright.
"""
import difflib
import math
import re

import yaml

from .errors import ConfigError

__all__ = ["Fields", "load_yaml", "did_you_mean"]


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping.

    Plain YAML keeps the last one silently: a second ``builds:`` would replace the first.
    """

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:  # an unhashable key: the base class says so
                break
            if first is not key_node:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line "
                                f"{first.start_mark.line + 1}; YAML would keep only the last)",
                    key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_yaml(path):
    """Safe-load ``path``; a missing file, a syntax error or a duplicate key is a `ConfigError`."""
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.load(f, Loader=_UniqueKeyLoader)  # noqa: S506 -- a SafeLoader
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:  # a directory, unreadable, not UTF-8
        raise ConfigError(f"{path}: cannot be read as UTF-8 text ({type(e).__name__}: {e})") from None


#: The spellings of a yes/no setting (``DRY_RUN``, ``FRESH``, ``RUN_MATRIX``), any case.
TRUE_WORDS, FALSE_WORDS = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_flag(name, value, default):
    """A yes/no setting given as text (None or blank: ``default``); anything else is a `ConfigError`."""
    if value is None or not str(value).strip():
        return default
    word = str(value).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ConfigError(f"{name} must be one of 1/0 (or true/false, yes/no, on/off); got {value!r}")


def did_you_mean(word, choices):
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or an empty string."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _kind(value):
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    return "a mapping" if isinstance(value, dict) else f"{type(value).__name__} {value!r}"


class Fields:
    """Typed access to the keys of one mapping; ``where`` prefixes every error message.

    Parameters
    ----------
    mapping : object
        What YAML gave for this entry; anything but a mapping is an error.
    where : str
        Names the entry in messages, e.g. ``"matrix.yaml: builds[2] (tensorflow 2.21)"``.
    allowed : iterable of str
        The keys this entry may hold; any other key is an error with a suggestion.
    """

    def __init__(self, mapping, where, allowed):
        if not isinstance(mapping, dict):
            raise ConfigError(f"{where}: expected a mapping, got {_kind(mapping)}")
        self.where = where
        self._map = mapping
        allowed = tuple(allowed)
        for key in mapping:
            if key not in allowed:
                raise ConfigError(f"{where}: unknown key {key!r}{did_you_mean(key, allowed)}; "
                                  f"allowed keys: {', '.join(allowed)}")

    def has(self, key):
        return key in self._map and self._map[key] is not None

    def error(self, key, message):
        """A `ConfigError` about ``key`` of this entry."""
        return ConfigError(f"{self.where}: {key}: {message}")

    def _get(self, key, required, default):
        if self.has(key):
            return self._map[key]
        if required:
            raise self.error(key, "missing (required)")
        return default

    def string(self, key, *, pattern=None, example=None, required=True, default=None):
        """A string value; ``pattern`` (a regex) must match all of it."""
        value = self._get(key, required, default)
        if value is default and not self.has(key):
            return value
        return self._check_string(key, value, pattern, example)

    def _check_string(self, key, value, pattern, example):
        hint = f" such as {example!r}" if example else ""
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            raise self.error(key, f"expected a string{hint}, got the number {value!r}: quote it "
                                  f"(YAML reads 3.10 as the number 3.1)")
        if not isinstance(value, str):
            raise self.error(key, f"expected a string{hint}, got {_kind(value)}")
        if pattern is not None and not re.fullmatch(pattern, value):
            raise self.error(key, f"expected a string{hint} (matching {pattern}), got {value!r}")
        return value

    def string_list(self, key, *, pattern=None, example=None, required=True, default=None,
                    scalar_ok=False):
        """A non-empty list of strings (a single string too when ``scalar_ok``), as a tuple."""
        value = self._get(key, required, default)
        if value is default and not self.has(key):
            return value
        if scalar_ok and not isinstance(value, list):
            value = [value]
        if not isinstance(value, list) or not value:
            raise self.error(key, f"expected a non-empty list, got {_kind(value)}")
        items = tuple(self._check_string(f"{key}[{i}]", v, pattern, example)
                      for i, v in enumerate(value))
        duplicates = sorted({v for v in items if items.count(v) > 1})
        if duplicates:
            raise self.error(key, f"listed twice: {', '.join(duplicates)}")
        return items

    def choice(self, key, choices, *, required=True, default=None):
        """One of ``choices``."""
        value = self._get(key, required, default)
        if value not in choices:
            raise self.error(key, f"expected one of {', '.join(choices)}; got {value!r}"
                                  f"{did_you_mean(value, choices)}")
        return value

    def number(self, key, *, minimum, maximum=None, integer=False, required=True, default=None):
        """A number in ``[minimum, maximum]`` (an integer when ``integer``)."""
        value = self._get(key, required, default)
        if value is default and not self.has(key):
            return value
        kind = "an integer" if integer else "a number"
        ok_type = int if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, ok_type) or not math.isfinite(value):
            raise self.error(key, f"expected {kind}, got {_kind(value)}")
        if value < minimum or (maximum is not None and value > maximum):
            upper = f" and {maximum}" if maximum is not None else ""
            raise self.error(key, f"expected {kind} between {minimum}{upper}, got {value!r}"
                             if upper else f"expected {kind} >= {minimum}, got {value!r}")
        return value

    def regex(self, key, *, required=True, default=None):
        """A string that compiles as a Python regular expression."""
        value = self.string(key, required=required, default=default)
        if value is None:
            return None
        try:
            re.compile(value)
        except re.error as e:
            raise self.error(key, f"not a valid regular expression ({e}): {value!r}") from None
        return value
