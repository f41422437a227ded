//! Random123 known-answer vectors (from the Random123 distribution's kat_vectors).

use mizu_rng::{philox4x32_10, philox4x64_10};

#[test]
fn philox4x32_10_known_answers() {
    assert_eq!(
        philox4x32_10([0; 4], [0; 2]),
        [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
    );
    assert_eq!(
        philox4x32_10([0xffffffff; 4], [0xffffffff; 2]),
        [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
    );
    assert_eq!(
        philox4x32_10(
            [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
            [0xa4093822, 0x299f31d0]
        ),
        [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
    );
}

#[test]
fn philox4x64_10_known_answers() {
    assert_eq!(
        philox4x64_10([0; 4], [0; 2]),
        [
            0x16554d9eca36314c,
            0xdb20fe9d672d0fdc,
            0xd7e772cee186176b,
            0x7e68b68aec7ba23b
        ]
    );
    assert_eq!(
        philox4x64_10([u64::MAX; 4], [u64::MAX; 2]),
        [
            0x87b092c3013fe90b,
            0x438c3c67be8d0224,
            0x9cc7d7c69cd777b6,
            0xa09caebf594f0ba0
        ]
    );
    assert_eq!(
        philox4x64_10(
            [
                0x243f6a8885a308d3,
                0x13198a2e03707344,
                0xa4093822299f31d0,
                0x082efa98ec4e6c89
            ],
            [0x452821e638d01377, 0xbe5466cf34e90c6c]
        ),
        [
            0xa528f45403e61d95,
            0x38c72dbd566e9788,
            0xa5a1610e72fd18b5,
            0x57bd43b5e52b7fe6
        ]
    );
}
