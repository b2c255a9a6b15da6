//! Words of a text: the tokenizer, stop words and content words shared by the extractive
//! summarizer, summary keywords and the summary evaluation.
//!
//! Tokens are lowercase runs of ASCII letters and digits (everything else separates them),
//! the way ROUGE scorers tokenize. Stop words are NLTK's English list plus the pieces that
//! splitting contractions leaves behind ("don't" → "don", "t").

/// English stop words (NLTK's list, lowercase, plus contraction pieces), sorted.
#[rustfmt::skip]
pub const STOP_WORDS: &[&str] = &[
    "a", "about", "above", "after", "again", "against", "ain", "all", "am", "an", "and", "any",
    "are", "aren", "as", "at", "be", "because", "been", "before", "being", "below", "between",
    "both", "but", "by", "can", "couldn", "d", "did", "didn", "do", "does", "doesn", "doing",
    "don", "down", "during", "each", "few", "for", "from", "further", "had", "hadn", "has",
    "hasn", "have", "haven", "having", "he", "her", "here", "hers", "herself", "him",
    "himself", "his", "how", "i", "if", "in", "into", "is", "isn", "it", "its", "itself",
    "just", "ll", "m", "ma", "me", "mightn", "more", "most", "mustn", "my", "myself", "needn",
    "no", "nor", "not", "now", "o", "of", "off", "on", "once", "only", "or", "other", "our",
    "ours", "ourselves", "out", "over", "own", "re", "s", "same", "shan", "she", "should",
    "shouldn", "so", "some", "such", "t", "than", "that", "the", "their", "theirs", "them",
    "themselves", "then", "there", "these", "they", "this", "those", "through", "to", "too",
    "under", "until", "up", "ve", "very", "was", "wasn", "we", "were", "weren", "what", "when",
    "where", "which", "while", "who", "whom", "why", "will", "with", "won", "wouldn", "y",
    "you", "your", "yours", "yourself", "yourselves",
];

/// Whether `word` (lowercase) is a stop word.
pub fn is_stop_word(word: &str) -> bool {
    STOP_WORDS.binary_search(&word).is_ok()
}

/// The lowercase tokens of `text`: runs of ASCII letters and digits.
pub fn tokens(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
}

/// The tokens of `text` that are not stop words, in order.
pub fn content_words(text: &str) -> Vec<String> {
    tokens(text).filter(|w| !is_stop_word(w)).collect()
}

/// How many tokens of `text` are not stop words.
pub fn content_word_count(text: &str) -> usize {
    tokens(text).filter(|w| !is_stop_word(w)).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_words_are_sorted_and_unique() {
        assert!(STOP_WORDS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn content_words_skip_stop_words_and_punctuation() {
        assert_eq!(
            content_words("Hey Caroline! I don't think it's 3:30 yet."),
            vec!["hey", "caroline", "think", "3", "30", "yet"]
        );
        assert_eq!(content_word_count("Good to see ya!"), 3);
        assert_eq!(content_word_count("Take care!"), 2);
        assert_eq!(content_word_count(""), 0);
    }
}
