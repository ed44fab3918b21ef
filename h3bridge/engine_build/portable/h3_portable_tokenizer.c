/* h3_tokenizer.h for the portable backend: the byte-level BPE upstream's tokenizer implements
 * over Foundation, here over Jansson (JSON) and ICU (character classes, NFC), the libraries
 * that do those jobs in C. Written from upstream's header and its documented behaviour:
 *
 * - load: tokenizer.json must be a JSON object whose model is {"type": "BPE", "unk_token": null,
 *   "vocab": {...}, "merges": [...]} (merges as "left right" strings or [left, right] pairs) and
 *   whose normalizer is {"type": "NFC"}; added tokens may not ask for single_word, lstrip,
 *   rstrip or normalized. The same messages as upstream for each refusal.
 * - encode: added tokens are matched first (leftmost, then longest); the text between them is
 *   NFC-normalised, split by the Qwen2 pre-tokenizer pattern (contractions, letters with one
 *   leading non-letter, single digits, punctuation runs with trailing newlines, whitespace)
 *   and each piece is byte-level BPE merged by rank. An empty result is [151643] when asked.
 * - decode: added tokens verbatim, other tokens through the byte decoder, invalid UTF-8 as U+FFFD.
 */
#define _GNU_SOURCE
#include "h3_tokenizer.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>
#include <unicode/utf8.h>

/* ---- a string -> uint32 table (open addressing; keys owned) ---------------------------- */

typedef struct {
    char *key;
    size_t length;
    uint32_t value;
} pb_slot;

typedef struct {
    pb_slot *slots;
    size_t capacity;
    size_t used;
} pb_table;

static uint64_t pb_key_hash(const char *key, size_t length) {
    uint64_t hash = 1469598103934665603ull;
    for (size_t index = 0; index < length; index++) {
        hash ^= (unsigned char)key[index];
        hash *= 1099511628211ull;
    }
    return hash;
}

static int pb_table_grow(pb_table *table) {
    size_t capacity = table->capacity ? table->capacity * 2 : 1024;
    pb_slot *slots = calloc(capacity, sizeof(*slots));
    if (!slots) return 0;
    for (size_t index = 0; index < table->capacity; index++) {
        pb_slot *slot = &table->slots[index];
        if (!slot->key) continue;
        size_t at = pb_key_hash(slot->key, slot->length) & (capacity - 1);
        while (slots[at].key) at = (at + 1) & (capacity - 1);
        slots[at] = *slot;
    }
    free(table->slots);
    table->slots = slots;
    table->capacity = capacity;
    return 1;
}

static pb_slot *pb_table_find(const pb_table *table, const char *key, size_t length) {
    if (!table->capacity) return NULL;
    size_t at = pb_key_hash(key, length) & (table->capacity - 1);
    while (table->slots[at].key) {
        pb_slot *slot = &table->slots[at];
        if (slot->length == length && !memcmp(slot->key, key, length)) return slot;
        at = (at + 1) & (table->capacity - 1);
    }
    return NULL;
}

/* Insert or overwrite (later JSON keys and merges win, as in a dictionary). */
static int pb_table_put(pb_table *table, const char *key, size_t length, uint32_t value) {
    pb_slot *found = pb_table_find(table, key, length);
    if (found) {
        found->value = value;
        return 1;
    }
    if ((table->used + 1) * 2 > table->capacity && !pb_table_grow(table)) return 0;
    size_t at = pb_key_hash(key, length) & (table->capacity - 1);
    while (table->slots[at].key) at = (at + 1) & (table->capacity - 1);
    char *copy = malloc(length + 1);
    if (!copy) return 0;
    memcpy(copy, key, length);
    copy[length] = '\0';
    table->slots[at] = (pb_slot){copy, length, value};
    table->used++;
    return 1;
}

static void pb_table_free(pb_table *table) {
    for (size_t index = 0; index < table->capacity; index++) free(table->slots[index].key);
    free(table->slots);
    memset(table, 0, sizeof(*table));
}

/* ---- the tokenizer ------------------------------------------------------------------------ */

typedef struct {
    char *content;          /* UTF-8 */
    UChar *units;           /* UTF-16, for matching in the prompt */
    int32_t unit_count;
    uint32_t id;
} pb_added;

struct h3_tokenizer {
    pb_table vocab;
    pb_table merges;        /* "left\x01right" -> rank */
    char **inverse_vocab;   /* by id, NULL where absent */
    char **inverse_added;
    size_t id_count;        /* maximum id + 1 */
    pb_added *added;        /* sorted: longer first, then by content */
    size_t added_count;
    char byte_encoder[256][4];
    int16_t byte_decoder[324];
};

static void pb_error(char *error, size_t size, const char *format, ...) {
    if (!error || !size) return;
    va_list arguments;
    va_start(arguments, format);
    vsnprintf(error, size, format, arguments);
    va_end(arguments);
}

static int pb_utf8_put(char *output, uint32_t codepoint) {
    int32_t offset = 0;
    UBool failed = 0;
    U8_APPEND((uint8_t *)output, offset, 4, (UChar32)codepoint, failed);
    return failed ? 0 : (int)offset;
}

static UChar *pb_utf16(const char *utf8, size_t length, int32_t *count) {
    UErrorCode status = U_ZERO_ERROR;
    int32_t needed = 0;
    u_strFromUTF8(NULL, 0, &needed, utf8, (int32_t)length, &status);
    if (status != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(status)) return NULL;
    UChar *units = malloc(((size_t)needed + 1) * sizeof(UChar));
    if (!units) return NULL;
    status = U_ZERO_ERROR;
    u_strFromUTF8(units, needed + 1, count, utf8, (int32_t)length, &status);
    if (U_FAILURE(status)) {
        free(units);
        return NULL;
    }
    return units;
}

static int pb_added_order(const void *left_pointer, const void *right_pointer) {
    const pb_added *left = left_pointer, *right = right_pointer;
    if (left->unit_count != right->unit_count) return left->unit_count > right->unit_count ? -1 : 1;
    return u_strCompare(left->units, left->unit_count, right->units, right->unit_count, 0);
}

void h3_tokenizer_free(h3_tokenizer *tokenizer) {
    if (!tokenizer) return;
    pb_table_free(&tokenizer->vocab);
    pb_table_free(&tokenizer->merges);
    free(tokenizer->inverse_vocab);   /* entries point into the vocab table's keys (freed above) */
    free(tokenizer->inverse_added);
    for (size_t index = 0; index < tokenizer->added_count; index++) {
        free(tokenizer->added[index].content);
        free(tokenizer->added[index].units);
    }
    free(tokenizer->added);
    free(tokenizer);
}

static int pb_is_true(json_t *value) { return value && json_is_true(value); }

static int pb_merge_key(char **key, size_t *length, const char *left, size_t left_length,
                        const char *right, size_t right_length) {
    *length = left_length + 1 + right_length;
    *key = malloc(*length + 1);
    if (!*key) return 0;
    memcpy(*key, left, left_length);
    (*key)[left_length] = '\x01';
    memcpy(*key + left_length + 1, right, right_length);
    (*key)[*length] = '\0';
    return 1;
}

h3_tokenizer *h3_tokenizer_load(const char *path, char *error, size_t error_size) {
    if (error && error_size) error[0] = '\0';
    if (!path) {
        pb_error(error, error_size, "tokenizer path is required");
        return NULL;
    }
    FILE *file = fopen(path, "rb");
    if (!file) {
        pb_error(error, error_size, "cannot read tokenizer: %s", path);
        return NULL;
    }
    json_error_t parse_error;
    json_t *config = json_loadf(file, JSON_DECODE_ANY, &parse_error);
    fclose(file);
    if (!json_is_object(config)) {
        /* NSJSONSerialization's own description of unparsable data */
        pb_error(error, error_size, config ? "invalid tokenizer JSON" :
                 "The data couldn\xe2\x80\x99t be read because it isn\xe2\x80\x99t in the correct format.");
        json_decref(config);
        return NULL;
    }
    json_t *model = json_object_get(config, "model");
    json_t *normalizer = json_object_get(config, "normalizer");
    json_t *type = json_is_object(model) ? json_object_get(model, "type") : NULL;
    json_t *unk = json_is_object(model) ? json_object_get(model, "unk_token") : NULL;
    json_t *normalizer_type = json_is_object(normalizer) ? json_object_get(normalizer, "type") : NULL;
    json_t *vocab = json_is_object(model) ? json_object_get(model, "vocab") : NULL;
    json_t *merges = json_is_object(model) ? json_object_get(model, "merges") : NULL;
    if (!json_is_string(type) || strcmp(json_string_value(type), "BPE") != 0 || !json_is_null(unk) ||
        !json_is_string(normalizer_type) || strcmp(json_string_value(normalizer_type), "NFC") != 0 ||
        !json_is_object(vocab) || !json_is_array(merges)) {
        pb_error(error, error_size, "unexpected tokenizer specification");
        json_decref(config);
        return NULL;
    }
    h3_tokenizer *tokenizer = calloc(1, sizeof(*tokenizer));
    if (!tokenizer) goto out_of_memory;
    const char *symbol;
    json_t *number;
    size_t maximum_id = 0;
    json_object_foreach(vocab, symbol, number) {
        json_int_t id = json_is_integer(number) ? json_integer_value(number) : (json_int_t)json_number_value(number);
        if (id < 0) id = 0;
        if ((size_t)id > maximum_id) maximum_id = (size_t)id;
        if (!pb_table_put(&tokenizer->vocab, symbol, strlen(symbol), (uint32_t)id)) goto out_of_memory;
    }
    json_t *added = json_object_get(config, "added_tokens");
    size_t added_total = json_is_array(added) ? json_array_size(added) : 0;
    for (size_t index = 0; index < added_total; index++) {
        json_t *id = json_object_get(json_array_get(added, index), "id");
        json_int_t value = json_is_integer(id) ? json_integer_value(id) : 0;
        if (value > 0 && (size_t)value > maximum_id) maximum_id = (size_t)value;
    }
    tokenizer->id_count = maximum_id + 1;
    tokenizer->inverse_vocab = calloc(tokenizer->id_count, sizeof(char *));
    tokenizer->inverse_added = calloc(tokenizer->id_count, sizeof(char *));
    if (!tokenizer->inverse_vocab || !tokenizer->inverse_added) goto out_of_memory;
    for (size_t index = 0; index < tokenizer->vocab.capacity; index++) {
        pb_slot *slot = &tokenizer->vocab.slots[index];
        if (slot->key) tokenizer->inverse_vocab[slot->value] = slot->key;
    }
    size_t merge_count = json_array_size(merges);
    for (size_t rank = 0; rank < merge_count; rank++) {
        json_t *entry = json_array_get(merges, rank);
        const char *left = NULL, *right = NULL;
        size_t left_length = 0, right_length = 0;
        if (json_is_string(entry)) {
            const char *text = json_string_value(entry);
            const char *space = strchr(text, ' ');
            if (space) {
                left = text;
                left_length = (size_t)(space - text);
                right = space + 1;
                right_length = strlen(right);
            }
        } else if (json_is_array(entry) && json_array_size(entry) == 2 &&
                   json_is_string(json_array_get(entry, 0)) && json_is_string(json_array_get(entry, 1))) {
            left = json_string_value(json_array_get(entry, 0));
            right = json_string_value(json_array_get(entry, 1));
            left_length = strlen(left);
            right_length = strlen(right);
        }
        if (!left) {
            pb_error(error, error_size, "invalid tokenizer merge");
            h3_tokenizer_free(tokenizer);
            json_decref(config);
            return NULL;
        }
        char *key;
        size_t key_length;
        if (!pb_merge_key(&key, &key_length, left, left_length, right, right_length)) goto out_of_memory;
        int stored = pb_table_put(&tokenizer->merges, key, key_length, (uint32_t)rank);
        free(key);
        if (!stored) goto out_of_memory;
    }
    tokenizer->added = calloc(added_total ? added_total : 1, sizeof(pb_added));
    if (!tokenizer->added) goto out_of_memory;
    for (size_t index = 0; index < added_total; index++) {
        json_t *token = json_array_get(added, index);
        if (pb_is_true(json_object_get(token, "single_word")) || pb_is_true(json_object_get(token, "lstrip")) ||
            pb_is_true(json_object_get(token, "rstrip")) || pb_is_true(json_object_get(token, "normalized"))) {
            pb_error(error, error_size, "unsupported added-token policy");
            h3_tokenizer_free(tokenizer);
            json_decref(config);
            return NULL;
        }
        json_t *content = json_object_get(token, "content");
        json_t *id = json_object_get(token, "id");
        if (!json_is_string(content) || !json_string_length(content)) continue;
        uint32_t value = (uint32_t)(json_is_integer(id) ? json_integer_value(id) : 0);
        /* a later entry with the same content replaces the earlier one (a dictionary) */
        pb_added *slot = NULL;
        for (size_t seen = 0; seen < tokenizer->added_count; seen++)
            if (!strcmp(tokenizer->added[seen].content, json_string_value(content))) slot = &tokenizer->added[seen];
        if (!slot) {
            slot = &tokenizer->added[tokenizer->added_count++];
            slot->content = strdup(json_string_value(content));
            if (!slot->content) goto out_of_memory;
            slot->units = pb_utf16(slot->content, strlen(slot->content), &slot->unit_count);
            if (!slot->units) goto out_of_memory;
        }
        slot->id = value;
        tokenizer->inverse_added[value] = slot->content;
    }
    qsort(tokenizer->added, tokenizer->added_count, sizeof(pb_added), pb_added_order);
    /* inverse_added points at contents, which qsort moved as pointers: rebuild it */
    memset(tokenizer->inverse_added, 0, tokenizer->id_count * sizeof(char *));
    for (size_t index = 0; index < tokenizer->added_count; index++)
        tokenizer->inverse_added[tokenizer->added[index].id] = tokenizer->added[index].content;

    for (size_t index = 0; index < 324; index++) tokenizer->byte_decoder[index] = -1;
    unsigned extra = 0;
    for (unsigned byte = 0; byte < 256; byte++) {
        int visible = (byte >= '!' && byte <= '~') || (byte >= 0xa1 && byte <= 0xac) || (byte >= 0xae && byte <= 0xff);
        uint32_t codepoint = visible ? byte : 256 + extra++;
        int length = pb_utf8_put(tokenizer->byte_encoder[byte], codepoint);
        tokenizer->byte_encoder[byte][length] = '\0';
        tokenizer->byte_decoder[codepoint] = (int16_t)byte;
    }
    json_decref(config);
    return tokenizer;

out_of_memory:
    pb_error(error, error_size, "out of memory loading tokenizer");
    h3_tokenizer_free(tokenizer);
    json_decref(config);
    return NULL;
}

/* ---- encoding ----------------------------------------------------------------------------- */

typedef struct {
    uint32_t *values;
    size_t count;
    size_t capacity;
} pb_ids;

static int pb_ids_push(pb_ids *ids, uint32_t value) {
    if (ids->count == ids->capacity) {
        size_t capacity = ids->capacity ? ids->capacity * 2 : 64;
        uint32_t *values = realloc(ids->values, capacity * sizeof(*values));
        if (!values) return 0;
        ids->values = values;
        ids->capacity = capacity;
    }
    ids->values[ids->count++] = value;
    return 1;
}

static int pb_letter(UChar32 value) {
    int8_t category = u_charType(value);
    return category == U_UPPERCASE_LETTER || category == U_LOWERCASE_LETTER || category == U_TITLECASE_LETTER ||
           category == U_MODIFIER_LETTER || category == U_OTHER_LETTER;
}

static int pb_number(UChar32 value) {
    int8_t category = u_charType(value);
    return category == U_DECIMAL_DIGIT_NUMBER || category == U_LETTER_NUMBER || category == U_OTHER_NUMBER;
}

static int pb_space(UChar32 value) {
    return u_isUWhiteSpace(value) || (value >= 0x1c && value <= 0x1f);
}

static size_t pb_contraction(const UChar32 *points, size_t count, size_t index) {
    static const char *values[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
    if (points[index] != '\'') return 0;
    for (size_t item = 0; item < sizeof(values) / sizeof(values[0]); item++) {
        size_t length = strlen(values[item]);
        if (index + length > count) continue;
        int matches = 1;
        for (size_t offset = 1; offset < length; offset++) {
            UChar32 got = points[index + offset];
            if (got >= 'A' && got <= 'Z') got += 'a' - 'A';
            if (got != (unsigned char)values[item][offset]) matches = 0;
        }
        if (matches) return length;
    }
    return 0;
}

/* Byte-level BPE of one pre-tokenized piece (code points [start, stop)). */
static int pb_bpe(const h3_tokenizer *tokenizer, const UChar32 *points, size_t start, size_t stop,
                  pb_ids *output, char *failure, size_t failure_size) {
    /* the piece's UTF-8 bytes, each replaced by its byte-encoder symbol */
    size_t symbol_capacity = (stop - start) * 4 + 1;
    char **symbols = calloc(symbol_capacity, sizeof(char *));
    size_t *lengths = calloc(symbol_capacity, sizeof(size_t));
    size_t count = 0;
    int ok = 0;
    if (!symbols || !lengths) goto done;
    for (size_t index = start; index < stop; index++) {
        char bytes[4];
        int length = pb_utf8_put(bytes, (uint32_t)points[index]);
        for (int byte = 0; byte < length; byte++) {
            const char *encoded = tokenizer->byte_encoder[(unsigned char)bytes[byte]];
            symbols[count] = strdup(encoded);
            if (!symbols[count]) goto done;
            lengths[count++] = strlen(encoded);
        }
    }
    while (count > 1) {
        size_t best = 0;
        uint32_t best_rank = 0;
        int found = 0;
        for (size_t index = 0; index + 1 < count; index++) {
            char *key;
            size_t key_length;
            if (!pb_merge_key(&key, &key_length, symbols[index], lengths[index], symbols[index + 1],
                              lengths[index + 1])) goto done;
            pb_slot *slot = pb_table_find(&tokenizer->merges, key, key_length);
            free(key);
            if (slot && (!found || slot->value < best_rank)) {
                found = 1;
                best_rank = slot->value;
                best = index;
            }
        }
        if (!found) break;
        char *left = strdup(symbols[best]);
        char *right = strdup(symbols[best + 1]);
        size_t left_length = lengths[best], right_length = lengths[best + 1];
        if (!left || !right) {
            free(left);
            free(right);
            goto done;
        }
        size_t written = 0;
        for (size_t index = 0; index < count;) {
            if (index + 1 < count && lengths[index] == left_length && lengths[index + 1] == right_length &&
                !memcmp(symbols[index], left, left_length) && !memcmp(symbols[index + 1], right, right_length)) {
                char *merged = malloc(left_length + right_length + 1);
                if (!merged) {
                    free(left);
                    free(right);
                    goto done;
                }
                memcpy(merged, left, left_length);
                memcpy(merged + left_length, right, right_length);
                merged[left_length + right_length] = '\0';
                free(symbols[index]);
                free(symbols[index + 1]);
                symbols[written] = merged;
                lengths[written++] = left_length + right_length;
                index += 2;
            } else {
                symbols[written] = symbols[index];
                lengths[written++] = lengths[index];
                index++;
            }
        }
        for (size_t index = written; index < count; index++) symbols[index] = NULL;
        count = written;
        free(left);
        free(right);
    }
    for (size_t index = 0; index < count; index++) {
        pb_slot *slot = pb_table_find(&tokenizer->vocab, symbols[index], lengths[index]);
        if (!slot) {
            snprintf(failure, failure_size, "BPE symbol is absent from vocabulary: %s", symbols[index]);
            goto done;
        }
        if (!pb_ids_push(output, slot->value)) goto done;
    }
    ok = 1;
done:
    if (!ok && !failure[0]) snprintf(failure, failure_size, "out of memory encoding prompt");
    if (symbols)
        for (size_t index = 0; index < count; index++) free(symbols[index]);
    free(symbols);
    free(lengths);
    return ok;
}

/* NFC, then the Qwen2 pre-tokenizer, then BPE of each piece: UTF-16 units [start, stop). */
static int pb_encode_plain(const h3_tokenizer *tokenizer, const UChar *units, int32_t length, pb_ids *output,
                           char *failure, size_t failure_size) {
    UErrorCode status = U_ZERO_ERROR;
    const UNormalizer2 *nfc = unorm2_getNFCInstance(&status);
    if (U_FAILURE(status)) {
        snprintf(failure, failure_size, "unable to pre-tokenize input");
        return 0;
    }
    int32_t needed = unorm2_normalize(nfc, units, length, NULL, 0, &status);
    if (status != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(status)) {
        snprintf(failure, failure_size, "unable to pre-tokenize input");
        return 0;
    }
    UChar *normal = malloc(((size_t)needed + 1) * sizeof(UChar));
    UChar32 *points = malloc(((size_t)needed + 1) * sizeof(UChar32));
    if (!normal || !points) {
        free(normal);
        free(points);
        snprintf(failure, failure_size, "out of memory encoding prompt");
        return 0;
    }
    status = U_ZERO_ERROR;
    unorm2_normalize(nfc, units, length, normal, needed + 1, &status);
    size_t count = 0;
    for (int32_t index = 0; index < needed;) {
        UChar32 value;
        U16_NEXT(normal, index, needed, value);
        points[count++] = value;
    }
    free(normal);
    int ok = 1;
    size_t index = 0;
    while (ok && index < count) {
        size_t contraction = pb_contraction(points, count, index);
        if (contraction) {
            ok = pb_bpe(tokenizer, points, index, index + contraction, output, failure, failure_size);
            index += contraction;
            continue;
        }
        UChar32 value = points[index];
        ptrdiff_t letter_start = (ptrdiff_t)index;
        if (pb_letter(value)) {
        } else if (value != '\r' && value != '\n' && !pb_number(value) && index + 1 < count &&
                   pb_letter(points[index + 1])) {
            letter_start++;
        } else {
            letter_start = -1;
        }
        if (letter_start >= 0) {
            size_t stop = (size_t)letter_start;
            while (stop < count && pb_letter(points[stop])) stop++;
            ok = pb_bpe(tokenizer, points, index, stop, output, failure, failure_size);
            index = stop;
            continue;
        }
        if (pb_number(value)) {
            ok = pb_bpe(tokenizer, points, index, index + 1, output, failure, failure_size);
            index++;
            continue;
        }
        size_t punct_start = index + (value == ' ' && index + 1 < count && !pb_space(points[index + 1]) &&
                                      !pb_letter(points[index + 1]) && !pb_number(points[index + 1]));
        size_t stop = punct_start;
        while (stop < count && !pb_space(points[stop]) && !pb_letter(points[stop]) && !pb_number(points[stop]))
            stop++;
        if (stop > punct_start) {
            while (stop < count && (points[stop] == '\r' || points[stop] == '\n')) stop++;
            ok = pb_bpe(tokenizer, points, index, stop, output, failure, failure_size);
            index = stop;
            continue;
        }
        if (pb_space(value)) {
            size_t whitespace_end = index + 1;
            while (whitespace_end < count && pb_space(points[whitespace_end])) whitespace_end++;
            ptrdiff_t newline_end = -1;
            for (size_t cursor = index; cursor < whitespace_end; cursor++)
                if (points[cursor] == '\r' || points[cursor] == '\n') newline_end = (ptrdiff_t)cursor + 1;
            size_t piece_end;
            if (newline_end >= 0) piece_end = (size_t)newline_end;
            else if (whitespace_end == count) piece_end = whitespace_end;
            else if (whitespace_end - index > 1) piece_end = whitespace_end - 1;
            else piece_end = index + 1;
            ok = pb_bpe(tokenizer, points, index, piece_end, output, failure, failure_size);
            index = piece_end;
            continue;
        }
        snprintf(failure, failure_size, "unable to pre-tokenize input");
        ok = 0;
    }
    free(points);
    return ok;
}

static int pb_find(const UChar *text, int32_t length, int32_t from, const pb_added *token) {
    for (int32_t at = from; at + token->unit_count <= length; at++)
        if (!memcmp(text + at, token->units, (size_t)token->unit_count * sizeof(UChar))) return at;
    return -1;
}

int h3_tokenizer_encode(const h3_tokenizer *tokenizer, const char *utf8, int pad_empty, uint32_t **ids,
                        size_t *count, char *error, size_t error_size) {
    if (error && error_size) error[0] = '\0';
    if (!tokenizer || !utf8 || !ids || !count) return 0;
    *ids = NULL;
    *count = 0;
    int32_t length = 0;
    UChar *text = pb_utf16(utf8, strlen(utf8), &length);
    if (!text) {
        pb_error(error, error_size, "prompt is not valid UTF-8");
        return 0;
    }
    pb_ids output = {0};
    char failure[512] = "";
    int32_t start = 0;
    int ok = 1;
    while (ok && start < length) {
        int32_t best_at = -1;
        const pb_added *best = NULL;
        for (size_t index = 0; index < tokenizer->added_count; index++) {
            const pb_added *candidate = &tokenizer->added[index];
            int32_t at = pb_find(text, length, start, candidate);
            if (at < 0) continue;
            if (!best || at < best_at || (at == best_at && candidate->unit_count > best->unit_count)) {
                best = candidate;
                best_at = at;
            }
        }
        if (!best) break;
        if (best_at > start)
            ok = pb_encode_plain(tokenizer, text + start, best_at - start, &output, failure, sizeof(failure));
        if (ok && !pb_ids_push(&output, best->id)) {
            snprintf(failure, sizeof(failure), "out of memory encoding prompt");
            ok = 0;
        }
        start = best_at + best->unit_count;
    }
    if (ok && start < length)
        ok = pb_encode_plain(tokenizer, text + start, length - start, &output, failure, sizeof(failure));
    free(text);
    if (ok && output.count == 0 && pad_empty) ok = pb_ids_push(&output, H3_PAD_TOKEN_ID);
    if (!ok) {
        pb_error(error, error_size, "%s", failure[0] ? failure : "tokenizer failure");
        free(output.values);
        return 0;
    }
    *ids = output.values;
    *count = output.count;
    if (!output.count) {
        free(output.values);
        *ids = NULL;
    }
    return 1;
}

void h3_tokenizer_ids_free(uint32_t *ids) { free(ids); }

/* ---- decoding ----------------------------------------------------------------------------- */

typedef struct {
    char *data;
    size_t length;
    size_t capacity;
} pb_text;

static int pb_text_add(pb_text *text, const void *bytes, size_t length) {
    if (text->length + length + 1 > text->capacity) {
        size_t capacity = (text->length + length + 1) * 2;
        char *data = realloc(text->data, capacity);
        if (!data) return 0;
        text->data = data;
        text->capacity = capacity;
    }
    memcpy(text->data + text->length, bytes, length);
    text->length += length;
    text->data[text->length] = '\0';
    return 1;
}

/* Pending byte-level bytes join the result as UTF-8 when they are valid, else as U+FFFD. */
static int pb_flush(pb_text *result, pb_text *bytes) {
    if (!bytes->length) return 1;
    int32_t needed = 0;
    UErrorCode status = U_ZERO_ERROR;
    u_strFromUTF8(NULL, 0, &needed, bytes->data, (int32_t)bytes->length, &status);
    int valid = status == U_BUFFER_OVERFLOW_ERROR || U_SUCCESS(status);
    int ok = valid ? pb_text_add(result, bytes->data, bytes->length) : pb_text_add(result, "\xef\xbf\xbd", 3);
    bytes->length = 0;
    return ok;
}

char *h3_tokenizer_decode(const h3_tokenizer *tokenizer, const uint32_t *ids, size_t count, char *error,
                          size_t error_size) {
    if (error && error_size) error[0] = '\0';
    if (!tokenizer || (!ids && count)) return NULL;
    pb_text result = {0}, bytes = {0};
    if (!pb_text_add(&result, "", 0)) goto out_of_memory;
    for (size_t index = 0; index < count; index++) {
        uint32_t id = ids[index];
        if (id >= tokenizer->id_count) {
            pb_error(error, error_size, "token ID is out of range");
            goto fail;
        }
        if (tokenizer->inverse_added[id]) {
            if (!pb_flush(&result, &bytes) ||
                !pb_text_add(&result, tokenizer->inverse_added[id], strlen(tokenizer->inverse_added[id])))
                goto out_of_memory;
            continue;
        }
        const char *symbol = tokenizer->inverse_vocab[id];
        if (!symbol) {
            pb_error(error, error_size, "unknown token ID");
            goto fail;
        }
        int32_t units = 0;
        UChar *utf16 = pb_utf16(symbol, strlen(symbol), &units);
        if (!utf16) goto out_of_memory;
        for (int32_t offset = 0; offset < units; offset++) {
            UChar unit = utf16[offset];
            if (unit >= 324 || tokenizer->byte_decoder[unit] < 0) {
                free(utf16);
                pb_error(error, error_size, "invalid byte-level token");
                goto fail;
            }
            unsigned char byte = (unsigned char)tokenizer->byte_decoder[unit];
            if (!pb_text_add(&bytes, &byte, 1)) {
                free(utf16);
                goto out_of_memory;
            }
        }
        free(utf16);
    }
    if (!pb_flush(&result, &bytes)) goto out_of_memory;
    free(bytes.data);
    return result.data;
out_of_memory:
    pb_error(error, error_size, "out of memory decoding tokens");
fail:
    free(result.data);
    free(bytes.data);
    return NULL;
}
