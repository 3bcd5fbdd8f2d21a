r"""What a predicate's functions may build: the filter's allow-list, chosen by output size.

DuckDB bounds the memory its buffer manager holds (``memory_limit``), not the strings and lists
a scalar function returns within one vector of :data:`VECTOR_ROWS` rows, and it checks for
interruption only between vectors: one vector of ``hex(hex(...(text)))`` (each level doubles)
or of ``bitstring('1', 2147483647)`` takes gigabytes and minutes whatever the limits. So what a
predicate may call is chosen by how large its output can be against its inputs, and nothing
else is callable:

- fixed: a small value of fixed size (numbers, booleans, dates, hashes, positions);
- keep: at most its largest argument (``lower``, ``substring``, ``trim``, list access);
- sum: at most its arguments together (``concat``, ``||``, ``list_value``);
- times: at most a fixed multiple of its arguments (``hex`` 2, ``bin`` 8, ``string_split`` 16:
  a list entry per character);
- rewrites (``replace``, ``regexp_replace``): the constant replacement's length times the input;
- pairwise similarities (``levenshtein``, ...): a fixed result, but work of the product of the
  two lengths, so one side must be a constant of at most :data:`MAX_GROWTH` characters;
- regular expressions (``regexp_matches``, ...): their pattern must be a constant (a computed
  one is compiled on every row).

Refused whatever their arguments: functions whose output a count or a width sizes (``repeat``,
``lpad``, ``bitstring``, ``range``, ``printf``, ``list_resize``, ``string_agg``, ...) and
anything else not named here. Casts count 8 times their input (``BLOB`` to text escapes each
byte in 4 characters, a list's text repeats separators).

A size is a linear form (:class:`Size`): bytes per row as ``coefficient * column`` terms plus
constant bytes. :class:`SizeCheck` gives a predicate's largest value (refused above
:data:`MAX_GROWTH` times the columns it reads) and its **work**: the sizes of every value it
builds, summed; once the version's column sizes are known (a vector's bytes of each column),
:meth:`Size.bytes` turns the work into bytes per vector, which the filter bounds by its memory.

Example:
    >>> s = Size.column("text").times(2) + Size.constant(3)
    >>> s.growth(), s.bytes({"text": 1000})
    (2.0, 2003.0)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "FUNCTIONS",
    "MAX_GROWTH",
    "PAIRWISE",
    "PATTERNS",
    "REFUSED",
    "REWRITES",
    "VECTOR_ROWS",
    "Size",
    "sized",
]

#: Rows per DuckDB vector: a function's output is built for this many rows at once.
VECTOR_ROWS = 2048
#: How many times the columns it reads a predicate's largest value may be.
MAX_GROWTH = 64
#: Bytes a fixed-size value may take (a hash's text, a timestamp, a number).
FIXED_BYTES = 64.0
#: How many times its input a cast may make a value.
CAST_GROWTH = 8.0


@dataclass(frozen=True)
class Size:
    """Bytes per row: ``sum(coefficient * column bytes) + constant``."""

    terms: tuple[tuple[str, float], ...] = ()
    const: float = 0.0

    @staticmethod
    def column(name: str) -> Size:
        return Size(((name, 1.0),))

    @staticmethod
    def constant(nbytes: float) -> Size:
        return Size((), float(nbytes))

    def _terms(self) -> dict[str, float]:
        return dict(self.terms)

    def __add__(self, other: Size) -> Size:
        terms = self._terms()
        for name, coef in other.terms:
            terms[name] = terms.get(name, 0.0) + coef
        return Size(tuple(sorted(terms.items())), self.const + other.const)

    def most(self, other: Size) -> Size:
        """An upper bound of the larger of two sizes (term by term)."""
        terms = self._terms()
        for name, coef in other.terms:
            terms[name] = max(terms.get(name, 0.0), coef)
        return Size(tuple(sorted(terms.items())), max(self.const, other.const))

    def times(self, factor: float) -> Size:
        return Size(tuple((n, c * factor) for n, c in self.terms), self.const * factor)

    def growth(self) -> float:
        """How many times the columns it reads (together) this size is."""
        return float(sum(c for _, c in self.terms))

    def bytes(self, columns: Mapping[str, float]) -> float:
        """Bytes, given each column's bytes (a missing column: 0)."""
        return self.const + sum(c * float(columns.get(n, 0.0)) for n, c in self.terms)


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# A small value of fixed size, whatever the arguments.
_FIXED = _names(
    """
    = <> != < > <= >= + - * / // % ** ^ ! ~~ !~~ ~~* !~~* ~~~ !~~~ ^@ && @> <@ <-> <=>
    like_escape not_like_escape ilike_escape not_ilike_escape glob regexp_matches
    regexp_full_match contains starts_with ends_with prefix suffix
    length len strlen char_length character_length octet_length bit_length length_grapheme
    strpos instr position ascii ord unicode hamming mismatches jaccard
    md5 md5_number sha1 sha256 hash typeof isnan isinf isfinite signbit even
    abs ceil ceiling floor round round_even roundbankers trunc sqrt cbrt ln log log2 log10 exp
    pow power sign gcd lcm greatest_common_divisor least_common_multiple bit_count degrees
    radians sin cos tan asin acos atan atan2 cot gamma lgamma factorial nextafter fdiv fmod
    year month day dayofmonth dayofweek dayofyear week weekofyear weekday yearweek quarter
    hour minute second millisecond microsecond nanosecond epoch epoch_ms epoch_us epoch_ns
    isoyear isodow era decade century millennium julian date_part datepart date_trunc datetrunc
    date_diff datediff date_sub datesub date_add age last_day monthname dayname days_in_month
    time_bucket make_date make_time make_timestamp to_timestamp strptime try_strptime
    to_years to_months to_weeks to_days to_hours to_minutes to_seconds to_milliseconds
    to_microseconds to_centuries to_decades to_millennia
    now current_date current_time current_timestamp get_current_time get_current_timestamp
    today transaction_timestamp localtimestamp localtime
    array_length list_position list_indexof array_position array_indexof list_unique
    array_unique list_contains list_has array_contains array_has list_has_any list_has_all
    array_has_any array_has_all cardinality json_valid json_array_length json_type
    """
)
# At most the largest argument.
_KEEP = _names(
    """
    trim ltrim rtrim substring substr substring_grapheme left right left_grapheme
    right_grapheme reverse split_part regexp_extract nullif ifnull if greatest least
    & | ~ << >> xor
    list_extract list_element array_extract list_slice array_slice struct_extract
    struct_extract_at element_at map_extract map_extract_value map_keys map_values
    list_sort array_sort list_reverse_sort array_reverse_sort list_distinct array_distinct
    list_reverse array_reverse flatten strip_accents from_base64 unhex from_hex url_decode
    from_binary unbin json_extract json_extract_string -> ->> json_extract_path
    json_extract_path_text
    """
)
# At most the arguments together.
_SUM = _names(
    """
    concat || list_concat list_cat array_concat array_cat list_value list_pack array_value
    struct_pack row list_append array_append list_prepend array_prepend
    """
)
# At most a fixed multiple of the arguments together.
_TIMES = {
    "lower": 2.0,  # a few case mappings lengthen a character's UTF-8 encoding
    "upper": 2.0,
    "lcase": 2.0,
    "ucase": 2.0,
    "hex": 2.0,
    "to_hex": 2.0,
    "bin": 8.0,
    "to_binary": 8.0,
    "to_base64": 2.0,
    "base64": 2.0,
    "url_encode": 3.0,
    "nfc_normalize": 3.0,
    "translate": 4.0,
    "strftime": 16.0,  # of the format: '%c' is 2 characters, up to 24 out
    "concat_ws": 2.0,  # the separator between each pair
    "string_split": 16.0,  # a 16-byte list entry per character
    "str_split": 16.0,
    "string_to_array": 16.0,
    "regexp_split_to_array": 16.0,
    "string_split_regex": 16.0,
    "str_split_regex": 16.0,
}
#: String rewrites: (index of the replacement argument, growth added by empty matches).
REWRITES = {"replace": (2, 0), "regexp_replace": (2, 1)}
#: Regular-expression functions: the index of their pattern, which must be a constant (a
#: computed one is compiled again on every row, a vector of them without interruption).
PATTERNS = {
    "regexp_matches": 1,
    "regexp_full_match": 1,
    "regexp_extract": 1,
    "regexp_replace": 1,
    "regexp_split_to_array": 1,
    "string_split_regex": 1,
    "str_split_regex": 1,
}
#: Similarities whose work is the product of their two arguments' lengths.
PAIRWISE = _names(
    "levenshtein editdist3 damerau_levenshtein jaro_similarity jaro_winkler_similarity"
)
#: Every function a predicate may call, with how its output is sized.
FUNCTIONS: dict[str, str | float] = {
    **dict.fromkeys(_FIXED, "fixed"),
    **dict.fromkeys(PAIRWISE, "fixed"),
    **dict.fromkeys(_KEEP, "keep"),
    **dict.fromkeys(_SUM, "sum"),
    **dict.fromkeys(REWRITES, "rewrite"),
    **_TIMES,
}
#: Functions refused by name with the reason (their output size is a count or width they take).
REFUSED = _names(
    """
    repeat lpad rpad bar range generate_series list_resize array_resize printf format
    to_base bitstring string_agg group_concat listagg list_aggregate list_aggr
    array_aggregate array_aggr aggregate array_to_string list_zip array_zip unnest
    list_grade_up array_grade_up
    """
)


def sized(name: str, arguments: list[Size]) -> Size:
    """The output size of an allowed function (not a rewrite) over its arguments' sizes."""
    rule = FUNCTIONS[name]
    total = Size()
    for size in arguments:
        total = total + size
    if rule == "fixed":
        return Size.constant(FIXED_BYTES)
    if rule == "keep":
        out = Size()
        for size in arguments:
            out = out.most(size)
        return out
    if rule == "sum":
        return total
    assert isinstance(rule, float), rule
    return total.times(rule)
